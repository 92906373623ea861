#include "shardwise/cli/train/train_options.h"

#include <fmt/format.h>

#include "shardwise/cli/help_format.h"
#include "shardwise/cli/train/stored_options.h"
#include "shardwise/cli/usage.h"

namespace shardwise::cli {

const std::vector<OptionSection>& train_option_sections() {
  static const std::vector<OptionSection> sections = {
      {"model", "Model",
       {"model", "layers", "heads", "hidden", "seq", "vocab", "kv-heads", "head-dim", "intermediate-size", "tied-head", "rope-theta",
        "rms-norm-eps", "experts", "top-k", "moe-layers", "aux-loss", "aux-loss-scope", "router-z-loss",
        "capacity-factor", "router", "shared-expert-width", "dropout", "bf16", "compute", "recompute", "recompute-layers",
        "attention", "cp-attention", "lm-head", "lora-rank", "lora-alpha", "lora-targets", "lora-dropout", "lora-rslora"}},
      {"parallel", "Parallelism",
       {"auto", "mesh", "ranks", "device", "sp", "schedule", "virtual", "micro-batches", "sharding-stage", "sharding-layout",
        "prefetch-params", "overlap-grad-reduce", "grad-bucket-mb", "gemm", "memory-limit"}},
      {"optimizer", "Optimizer",
       {"steps", "epochs", "tokens", "global-batch", "micro-batch", "accumulation", "lr", "min-lr", "warmup", "weight-decay", "beta1",
        "beta2", "clip", "seed", "skip-nonfinite-steps"}},
      {"data", "Data",
       {"data", "data-format", "tokenizer", "documents", "document-separator", "eos-id", "no-cross-document-attention",
        "no-prefetch", "val-data", "val-fraction", "val-samples", "digits", "eval-samples"}},
      {"checkpoint", "Checkpoints",
       {"save-every", "save-dir", "save-total-limit", "async-save", "save-on-interrupt", "max-shard-size", "resume",
        "no-verify-resume", "save-model-only", "skip-optimizer", "init-from", "ignore-keys", "resize-vocab", "lora-from"}},
      {"logging", "Logging",
       {"run-dir", "eval-every", "log-every", "progress", "loss-axis", "profile", "dry-run", "json"}},
  };
  return sections;
}

namespace {

// Input files and directories: a --config file resolves these from its own directory.
constexpr std::pair<std::string_view, std::string_view> kPathTypes[] = {
    {"data", "PATHS"},  {"val-data", "PATHS"}, {"tokenizer", "PATH"},
    {"init-from", "PATH"}, {"lora-from", "PATH"}, {"resume", "PATH|auto"}};

// Where an option comes in --help: its section's place, then its place in the section.
std::pair<size_t, size_t> help_order(const CLI::Option* opt) {
  const auto& sections = train_option_sections();
  for (size_t s = 0; s < sections.size(); ++s) {
    const auto& names = sections[s].options;
    for (size_t i = 0; i < names.size(); ++i) {
      if (opt->check_lname(std::string(names[i]))) return {s + 1, i};
    }
  }
  return {0, 0};  // --help and --config come first
}

// CLI11's help with the sections in train_option_sections' order (each option in its section's
// order), without CLI11's artefacts (CleanHelpFormatter).
class HelpFormatter : public CleanHelpFormatter {
 public:
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return CLI::Formatter::make_help(app, name, mode);
    std::vector<const CLI::Option*> opts =
        app->get_options([](const CLI::Option* o) { return !o->get_group().empty() && o->nonpositional(); });
    std::stable_sort(opts.begin(), opts.end(), [](auto* a, auto* b) { return help_order(a) < help_order(b); });
    std::string out = make_description(app) + make_usage(app, name);
    for (size_t i = 0; i < opts.size();) {
      size_t end = i;
      while (end < opts.size() && opts[end]->get_group() == opts[i]->get_group()) ++end;
      out += make_group(opts[i]->get_group(), false, {opts.begin() + static_cast<std::ptrdiff_t>(i),
                                                      opts.begin() + static_cast<std::ptrdiff_t>(end)});
      i = end;
    }
    return out + make_footer(app);
  }
};

}  // namespace

void group_train_options(CLI::App& cmd) {
  for (const OptionSection& s : train_option_sections()) {
    const std::string group = fmt::format("{} [{}]", s.title, s.key);
    for (std::string_view name : s.options) {
      if (CLI::Option* opt = cmd.get_option_no_throw("--" + std::string(name))) opt->group(group);
    }
  }
  for (auto [name, type] : kPathTypes) {
    if (CLI::Option* opt = cmd.get_option_no_throw("--" + std::string(name))) opt->type_name(std::string(type));
  }
  cmd.formatter(std::make_shared<HelpFormatter>());
}

void add_plan_options(CLI::App& cmd, TrainOptions& run, PlanOptions& plan) {
  add_train_options(cmd, run);
  group_train_options(cmd);
  const std::string group = "Plan: what to show";
  cmd.add_flag("--memory", plan.memory,
               "per rank: the bytes of parameters, gradients, optimizer state, activations and the peak; over "
               "--memory-limit, \"does not fit\" with the largest cause and the change that fixes it")
      ->group(group);
  cmd.add_flag("--check", plan.check, "with --memory: exit 2 when the plan does not fit --memory-limit")->group(group);
  cmd.add_flag("--symmetric", plan.symmetric,
               "with --memory: plan only the first rank of each pipeline rank, each standing for its pipeline rank's "
               "ranks (the same shapes when every sharded dim divides evenly): for meshes of thousands of ranks")
      ->group(group);
  cmd.add_option("--kept", plan.kept,
                 "with --memory: on each planned rank, the N largest tensors one micro-batch keeps from its forward "
                 "for its backward, and the instruction that reads each (--json: every one)")
      ->group(group);
  cmd.add_option("--explain", plan.explain,
                 "value names (as the plan shows them): say which rule and neighbour placed them")
      ->delimiter(',')
      ->group(group);
  cmd.add_flag("--summary", plan.summary, "only the totals")->group(group);
  cmd.add_flag("--predict", plan.predict,
               "the predicted step time, tokens/s, MFU and the shares of compute, each collective kind and the "
               "bubble (docs/planner.md; --json for JSON)")
      ->group(group);
  cmd.get_option("--auto")->description(  // train's flag (its Parallelism section): here the search itself
      "search every mesh and option combination (docs/planner.md) and show the fastest predicted (the plan options "
      "--devices, --top, --memory-margin, --max-micro-batch, --cluster); the model options, --seq and "
      "--global-batch are the job's");
  cmd.add_flag("--analytic", plan.analytic,
               "with --predict or --auto: the analytic per-layer model (plan --auto's above 64 devices) instead of the "
               "compiled programs")
      ->group(group);
  cmd.add_option("--devices", plan.devices, "with --auto: the devices to spread the job over (0: the cluster's)")->group(group);
  cmd.add_option("--top", plan.top, "with --auto: how many candidates to show")->group(group);
  cmd.add_option("--memory-margin", plan.memory_margin,
                 "with --auto: the share of each device's memory kept free (the memory rule)")
      ->group(group);
  cmd.add_option("--max-micro-batch", plan.max_micro_batch, "with --auto: the largest micro-batch tried (0: any)")->group(group);
  cmd.add_option("--backend", plan.backend,
                 "with --predict or --auto on this machine's calibration: the ranks as threads or MPI processes, "
                 "predicted with that backend's calibrated collectives (auto: mpi under mpirun)")
      ->check(CLI::IsMember({"auto", "threads", "mpi"}))
      ->capture_default_str()
      ->group(group);
  cmd.add_option("--cluster", plan.cluster,
                 "with --predict or --auto: a cluster description (examples/clusters/*.json); default: this machine as "
                 "`shardwise calibrate` cached it")
      ->type_name("FILE")
      ->group(group);
}

void apply_run_sources(CLI::App& cmd, TrainOptions& o, bool lora_needs_base) {
  if (!o.config_file.empty()) apply_config_file(cmd, o.config_file);
  o.resume_notes = apply_stored_options(cmd, o);  // --resume: the checkpoint's options are the defaults
  o.vocab_given = cmd.count("--vocab") > 0 || !o.checkpoint.init_from.empty();
  o.steps_given = cmd.count("--steps") > 0;
  SW_CHECK(o.checkpoint.resize_vocab >= 0, "--resize-vocab must be a number of tokens, got {}", o.checkpoint.resize_vocab);
  SW_CHECK(o.checkpoint.resize_vocab == 0 || !o.checkpoint.init_from.empty(), "--resize-vocab {} grows the vocabulary "
           "of an --init-from model: a fresh model's is --vocab", o.checkpoint.resize_vocab);
  if (!o.checkpoint.init_from.empty()) apply_init_from(cmd, o);
  apply_lora(cmd, o, lora_needs_base);
}

}  // namespace shardwise::cli
