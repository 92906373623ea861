// `shardwise train`: trains the GPT model on the ranks of a mesh (threads by default, MPI
// processes under mpirun) with a live progress line, a summary, metrics.jsonl and a loss curve.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <tuple>

#include <fmt/ranges.h>

#include "shardwise/cli/ckpt_cmd.h"
#include "shardwise/cli/commands.h"
#include "shardwise/cli/train/data_defaults.h"
#include "shardwise/cli/gemm_cmd.h"
#include "shardwise/cli/train/progress.h"
#include "shardwise/cli/train/run_header.h"
#include "shardwise/cli/train/interrupt.h"
#include "shardwise/cli/train/train_run.h"
#include "shardwise/comm/local.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/models/custom.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/parallel.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/runtime/profiled_comm.h"
#include "shardwise/runtime/profiler.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/train/metrics.h"
#include "shardwise/models/model_io.h"
#include "shardwise/models/custom.h"
#include "shardwise/models/models.h"
#include "shardwise/train/run_dir.h"
#include "shardwise/train/run_guard.h"
#include "shardwise/train/vocab_resize.h"
#include "shardwise/core/plural.h"

namespace shardwise::cli {

namespace {

// The vocabulary an --init-from run trains: the directory's vocab_size, grown to the ids of its
// tokenizer (tokens added to it) or to --resize-vocab N (train/vocab_resize.h); never shrunk.
int64_t init_from_vocab(const TrainOptions& o, int64_t saved) {
  const std::string& dir = o.checkpoint.init_from;
  const int64_t ids = train::tokenizer_ids(dir), asked = o.checkpoint.resize_vocab;
  if (asked == 0) return std::max(saved, ids);
  SW_CHECK(asked >= saved, "--resize-vocab {} is below the vocab_size {} of --init-from {}: shrinking the vocabulary is "
           "refused (it would drop the rows of ids {} to {}); give {} or more", asked, saved, dir, asked, saved - 1, saved);
  SW_CHECK(asked >= ids, "--resize-vocab {} is below the {} ids of the tokenizer in --init-from {} (its added tokens "
           "need rows): give {} or more", asked, ids, dir, ids);
  return asked;
}

}  // namespace

void apply_init_from(CLI::App& cmd, TrainOptions& o) {
  SW_CHECK(ckpt::fs::is_directory(o.checkpoint.init_from), "--init-from '{}' is not a directory", o.checkpoint.init_from);
  const train::GptConfig saved = train::read_model_config(o.checkpoint.init_from);
  const int64_t vocab = init_from_vocab(o, saved.vocab);
  train::GptConfig& m = o.config.model;
  SW_CHECK(cmd.count("--model") == 0 || m.model_type == saved.model_type,
           "--model {} contradicts --init-from {}, whose config.json holds a {} model: leave the option out (the "
           "model comes from the directory)", m.model_type, o.checkpoint.init_from, saved.model_type);
  m.model_type = saved.model_type;
  const bool llama = saved.is_llama();
  std::vector<std::tuple<const char*, int64_t*, int64_t>> fields = {
      {"--layers", &m.layers, saved.layers}, {"--heads", &m.heads, saved.heads}, {"--hidden", &m.hidden, saved.hidden},
      {"--vocab", &m.vocab, vocab}};
  if (llama) {
    fields.push_back({"--kv-heads", &m.kv_heads, saved.key_value_heads()});
    fields.push_back({"--intermediate-size", &m.intermediate_size, saved.mlp_width()});
    fields.push_back({"--experts", &m.experts, saved.experts});  // Mixtral: num_local_experts
    if (saved.experts > 0) fields.push_back({"--top-k", &m.top_k, saved.top_k});
  }
  // Llama has no position parameter: a run may train on sequences up to max_position_embeddings.
  if (!llama || cmd.count("--seq") == 0 || m.seq > saved.seq) fields.push_back({"--seq", &m.seq, saved.seq});
  for (auto [flag, value, from_dir] : fields) {
    std::string has = fmt::format("config.json has {}", from_dir);
    if (llama && std::string(flag) == "--seq") has += " (max_position_embeddings; --seq may be shorter)";
    if (std::string(flag) == "--vocab" && vocab != saved.vocab)  // grown: config.json says the old size
      has = fmt::format("model trains {} tokens (its config.json's vocab_size {} grown for {})", vocab, saved.vocab,
                        o.checkpoint.resize_vocab > 0 ? "--resize-vocab" : "its tokenizer's added tokens");
    SW_CHECK(cmd.count(flag) == 0 || *value == from_dir,
             "{} {} contradicts --init-from {}, whose {}: leave the option out (the model comes from the directory)",
             flag, *value, o.checkpoint.init_from, has);
    *value = from_dir;
  }
  if (llama) {
    SW_CHECK(cmd.count("--tied-head") == 0 || m.tie_word_embeddings == saved.tie_word_embeddings,
             "--{} contradicts --init-from {}, whose config.json has tie_word_embeddings {}",
             m.tie_word_embeddings ? "tied-head" : "untied-head", o.checkpoint.init_from, saved.tie_word_embeddings);
    m.tie_word_embeddings = saved.tie_word_embeddings;
    SW_CHECK(cmd.count("--head-dim") == 0 || m.head_dim == saved.head_size() || m.head_dim == saved.head_dim,
             "--head-dim {} contradicts --init-from {}, whose config.json has head_dim {}: leave the option out (the "
             "model comes from the directory)", m.head_dim, o.checkpoint.init_from, saved.head_size());
    m.head_dim = saved.head_dim;
    if (saved.experts > 0) {  // the MoE layers (shardwise_mixtral's mlp_only_layers name the dense ones)
      SW_CHECK(cmd.count("--moe-layers") == 0 || train::moe_layer_list(m) == train::moe_layer_list(saved),
               "--moe-layers {} contradicts --init-from {}, whose config.json has MoE layers {}: leave the option out",
               fmt::join(train::moe_layer_list(m), ","), o.checkpoint.init_from,
               fmt::join(train::moe_layer_list(saved), ","));
      m.moe_layers = saved.moe_layers;
    }
    m.rope_theta = saved.rope_theta;
    m.rms_norm_eps = saved.rms_norm_eps;
    m.family = saved.family;  // Qwen2: q/k/v biases
    m.sliding_window = saved.sliding_window;  // Mistral: refused when shorter than --seq
  }
  m.layer_norm_epsilon = saved.layer_norm_epsilon;
  m.init_std = saved.init_std;
  o.config.init_token_ids = train::read_stored_token_ids(o.checkpoint.init_from);  // its checkpoints keep them
  o.config.init_vocab = saved.vocab;
  // The directory's dropout (GPT-2's *_pdrop, Llama's attention_dropout) unless --dropout sets it.
  if (cmd.count("--dropout") == 0) o.config.dropout = train::stored_dropout(o.checkpoint.init_from);
}

// Whether `targets` (and a regex) adapt the same modules of `model` as `saved` does: PEFT saves
// all-linear as the module names it resolved to, so the lists alone can differ for the same modules.
bool same_lora_modules(train::GptConfig model, const train::LoraConfig& mine, const train::LoraConfig& saved) {
  auto paths = [&](const std::vector<std::string>& targets, const std::string& regex) {
    model.lora = saved;
    model.lora.targets = targets, model.lora.target_regex = regex;
    std::vector<std::string> out;
    for (const train::LoraModule& m : train::lora_modules(model)) out.push_back(m.path);
    return out;
  };
  try {
    return paths(mine.targets, mine.target_regex) == paths(saved.targets, saved.target_regex);
  } catch (const Error&) {  // a list that matches nothing here: not the saved adapters' modules
    return false;
  }
}

void apply_lora(CLI::App& cmd, TrainOptions& o, bool needs_base) {
  train::LoraConfig& l = o.config.model.lora;
  const char* flags[] = {"--lora-rank", "--lora-alpha", "--lora-targets", "--lora-dropout", "--lora-rslora"};
  std::vector<std::string> given;
  for (const char* f : flags)
    if (cmd.count(f) > 0) given.push_back(f);
  if (!o.checkpoint.lora_from.empty()) {
    const train::LoraConfig saved = train::read_adapter_config(o.checkpoint.lora_from);
    auto agree = [&](const char* flag, bool same, const std::string& mine, const std::string& theirs) {
      SW_CHECK(cmd.count(flag) == 0 || same, "{} {} contradicts --lora-from {}, whose adapter_config.json has {}: leave "
               "the option out (the adapters' configuration comes from the directory)", flag, mine, o.checkpoint.lora_from, theirs);
    };
    agree("--lora-rank", l.rank == saved.rank, std::to_string(l.rank), fmt::format("r {}", saved.rank));
    agree("--lora-alpha", l.alpha == saved.alpha, fmt::format("{}", l.alpha), fmt::format("lora_alpha {}", saved.alpha));
    agree("--lora-dropout", l.dropout == saved.dropout, fmt::format("{}", l.dropout),
          fmt::format("lora_dropout {}", saved.dropout));
    agree("--lora-rslora", l.rslora == saved.rslora, "", fmt::format("use_rslora {}", saved.rslora));
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    agree("--lora-targets",
          (saved.target_regex.empty() && sorted(l.targets) == sorted(saved.targets)) ||
              same_lora_modules(o.config.model, l, saved),
          fmt::format("{}", fmt::join(l.targets, ",")),
          saved.target_regex.empty() ? fmt::format("target_modules [{}]", fmt::join(saved.targets, ", "))
                                     : "target_modules '" + saved.target_regex + "'");
    l = saved;
  } else if (cmd.count("--lora-rank") > 0 || l.rank != 0) {
    SW_CHECK(l.rank >= 1, "--lora-rank must be at least 1, got {} (leave it out to train every parameter)", l.rank);
  } else {
    SW_CHECK(given.empty(), "{} needs --lora-rank R (or --lora-from an adapter directory)", fmt::join(given, ", "));
    return;
  }
  SW_CHECK(!needs_base || !o.checkpoint.init_from.empty(), "{} trains adapters on a base model, whose weights stay frozen: pass --init-from DIR "
           "(a transformers save_pretrained directory or a shardwise checkpoint)",
           o.checkpoint.lora_from.empty() ? fmt::format("--lora-rank {}", l.rank) : "--lora-from " + o.checkpoint.lora_from);
}

namespace {

constexpr const char* kRunsRoot = train::kRunsRoot;

// --profile on rank 0, after the run's summary: the table, then the trace (an error writing it
// comes after everything else is printed and saved).
void report_profile(const runtime::ProfileReport& r, const std::string& run_dir, std::ostream& out) {
  out << runtime::format_profile(r) << std::flush;
  const std::string path = run_dir + "/trace.json";
  runtime::write_chrome_trace(r, path);
  out << fmt::format("  trace: {} (open it in https://ui.perfetto.dev)\n", path);
}

// The run header's line on the gradient buckets ("" without them).
std::string buckets_line(const train::Trainer& t) {
  if (!t.grad_buckets()) return "";
  return fmt::format("  gradients: reduced over dp in buckets of {} MiB, {}\n", t.config().parallel.grad_bucket_mb,
                     t.config().parallel.overlap_grad_reduce == "on" ? "each started during the backward" : "after the backward");
}

// The run header's sharding line.
std::string sharding_line(const train::ShardingConfig& s, int64_t optimizer_bytes) {
  if (s.shards_params())
    return fmt::format("  sharding: stage 3, parameters, gradients and optimizer state split over dp (all-gathered "
                       "before each use): {} bytes of optimizer state on this rank\n",
                       optimizer_bytes);
  return fmt::format("  sharding: stage {}, layout {}: {} bytes of optimizer state on this rank\n", s.stage, s.layout,
                     optimizer_bytes);
}

// An MoE run's step line: the most loaded expert over the mean (the worst MoE layer's) and the
// drops of every layer; "" for a dense model.
std::string moe_summary(const std::vector<train::MoeStepStats>& moe) {
  if (moe.empty()) return "";
  double imbalance = 0;
  int64_t dropped = 0;
  for (const train::MoeStepStats& m : moe) {
    if (m.tokens_mean > 0) imbalance = std::max(imbalance, m.tokens_max / m.tokens_mean);
    dropped += m.dropped;
  }
  return fmt::format("  moe max/mean {:.2f} dropped {}", imbalance, dropped);
}

// The summary's checkpoint line: where, the newest step, and how long the saves stopped training.
std::string checkpoint_summary(const train::CheckpointSchedule& checkpoints, const std::string& dir, int64_t newest) {
  const auto& st = checkpoints.stalls();
  return fmt::format("  checkpoints: {} (newest: step {}); {} save{} stopped training for {:.2f} s, the longest {:.2f} s{}\n",
                     dir, newest, st.saves, st.saves == 1 ? "" : "s", st.total_s, st.longest_s,
                     checkpoints.async() ? " (async: the copies into host memory)" : "");
}

// The run header's LoRA line: the adapters, and the parameters they train of the model's.
std::string lora_line(const train::GptConfig& model, const train::ParameterCounts& n, int64_t rank0_optimizer_bytes) {
  const train::LoraConfig& l = model.lora;
  const auto all = static_cast<double>(n.trained + n.frozen);
  return fmt::format("  LoRA: r {}, alpha {} (scale {:.4g}{}) on {}; base frozen: {} trainable parameters of {} "
                     "({:.2f}%); optimizer state {} bytes (adapters only; rank 0: {})\n",
                     l.rank, l.alpha, l.scale(), l.rslora ? ", rsLoRA" : "",
                     train::lora_targets_text(model),
                     n.trained, n.trained + n.frozen, 100.0 * static_cast<double>(n.trained) / all, n.optimizer_bytes,
                     rank0_optimizer_bytes);
}

// The run's directory, the same on every rank (rank 0 decides): --run-dir; else the run that --resume
// continues (a checkpoint's run, <run>/checkpoints/checkpoint-N; for auto, the newest run of this
// name with a checkpoint); else a new directory of this run's own, runs/<name>-<time>, which
// runs/latest then names. Rank 0 prints `notes`.
std::string choose_run_dir(const TrainOptions& o, const train::TrainConfig& c, comm::Communicator& world,
                           std::vector<std::string>& notes) {
  nlohmann::json said;
  if (world.rank() == 0) {
    try {
      std::string dir = o.logging.run_dir;
      const std::string name = train::run_name(o.config_file, c.model);
      ckpt::fs::path from = ckpt::fs::path(o.checkpoint.resume).lexically_normal();
      if (from.filename().empty()) from = from.parent_path();
      if (!dir.empty() || !o.checkpoint.save_dir.empty()) {
      } else if (!o.checkpoint.resume.empty() && o.checkpoint.resume != "auto" && from.parent_path().filename() == "checkpoints") {
        dir = from.parent_path().parent_path().string();
        said["notes"].push_back(fmt::format("run directory: {} (the run of {})", dir, o.checkpoint.resume));
      } else if (auto newest = o.checkpoint.resume == "auto" ? train::newest_run_with_checkpoint(kRunsRoot, name) : std::nullopt) {
        dir = *newest;
        said["notes"].push_back(fmt::format("run directory: {} (--resume auto: the newest run named {} with a "
                                            "checkpoint; --run-dir chooses another)", dir, name));
      }
      std::error_code ec;
      if (!dir.empty() && ckpt::fs::is_symlink(dir, ec))  // runs/latest: the run it names now, for the whole run
        dir = (ckpt::fs::path(dir).parent_path() / ckpt::fs::read_symlink(dir, ec)).lexically_normal().string();
      if (dir.empty()) {
        dir = train::claim_run_dir(kRunsRoot, name, std::time(nullptr));
        said["notes"].push_back(fmt::format("run directory: {} (a new one; {}/latest names it)", dir, kRunsRoot));
        if (std::string w = train::point_latest(kRunsRoot, dir); !w.empty()) said["notes"].push_back("warning: " + w);
      }
      said["dir"] = dir;
    } catch (const Error& e) {
      said["error"] = e.what();
    }
  }
  said = comm::broadcast_object(world, said, 0);
  if (said.contains("error")) fail("{}", said["error"].get<std::string>());
  if (said.contains("notes")) notes = said["notes"].get<std::vector<std::string>>();
  return said["dir"].get<std::string>();
}

// The live bar only on a terminal and not under mpirun; plain lines otherwise; none with --progress none.
ProgressPrinter::Mode progress_mode(const std::string& progress, const std::ostream& out) {
  if (progress == "none") return ProgressPrinter::Mode::None;
  const bool tty = progress == "bar" || (progress == "auto" && &out == &std::cout && isatty(STDOUT_FILENO) &&
                                         !comm::launched_by_mpirun());
  return tty ? ProgressPrinter::Mode::Bar : ProgressPrinter::Mode::Lines;
}

// What rank 0 keeps while the steps run, for the progress lines and the summary.
struct Progress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  double best = -1, last_acc = -1, last_val = -1;
  bool bar_open = false;  // the live bar's line has no newline yet
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

// Rank 0's header: the model, the mesh, the data and batch, and the options that change how it runs.
void print_header(const train::Trainer& trainer, const TrainOptions& o, const train::ParameterCounts& counts,
                  comm::Communicator& world_ref, const std::string& run_dir, std::ostream& out) {
  const auto& c = trainer.config();
  const bool fed = c.model.custom && !c.model.custom->feeds.empty();  // a Python model's own batches: no tokens read
  out << fmt::format("shardwise train: {}: {} parameters on {} ({}, {})\n", train::describe_model(c.model, true),
                     count_text(counts.trained + counts.frozen), trainer.strategy().to_string(),
                     counted(world_ref.size(), "rank"), world_ref.backend());
  if (!o.options_line.empty()) out << "  options: " << o.options_line << "\n";
  if (!o.auto_line.empty()) out << "  " << o.auto_line << "\n";
  out << fmt::format("  run directory: {}\n", run_dir);
  if (!o.gemm_line.empty()) out << "  " << o.gemm_line << "\n";
  if (!o.device_line.empty()) out << "  " << o.device_line << "\n";
  const train::Strategy& s = trainer.strategy();
  if (fed) {
    out << fmt::format("  data: the batches given from Python (inputs {})\n", fmt::join(c.model.custom->feeds, ", "));
  } else {
    out << fmt::format("  data: {}\n", trainer.data_description());
  }
  for (const std::string& line : o.data_notes) out << "  " << line << "\n";
  out << fmt::format("  batch: {} = micro-batch {} x accumulation {} x dp {}{}; {}, lr {} "
                     "(warm-up {}, cosine to {})\n",
                     counted(c.optimizer.global_batch, "sequence"), c.optimizer.micro_batch, c.optimizer.accumulation, s.dp_size(),
                     s.ep < 0 ? "" : fmt::format(" x ep {}", s.ep_size()), counted(c.optimizer.steps, "step"), c.optimizer.lr, c.optimizer.warmup, c.optimizer.min_lr);
  if (trainer.has_validation()) out << fmt::format("  validation: {}\n", trainer.validation_description());
  if (c.data.document_attention)
    out << fmt::format("  packing: documents end at id {}; attention and position ids stay within each document\n",
                       c.data.eos_id);
  if (c.parallel.sharding.enabled()) out << sharding_line(c.parallel.sharding, trainer.optimizer_state_bytes());
  out << buckets_line(trainer);
  if (s.pp >= 0)
    out << fmt::format("  pipeline: schedule {}, {} on pp={} ({} virtual per rank), {} per step\n", c.parallel.schedule,
                       counted(s.mesh.dim_size(s.pp) * c.parallel.virtual_stages, "stage"), s.mesh.dim_size(s.pp),
                       c.parallel.virtual_stages, counted(c.optimizer.accumulation, "micro-batch"));
  out.flush();
}

// Rank 0's summary: how the run ended (done, or stopped by a signal with the newest checkpoint and
// the command that continues it), the loader, the metrics and the loss curve.
void print_summary(const Progress& p, const train::MetricsLog& log, const train::Trainer& trainer,
                   const TrainOptions& o, const std::string& run_dir, const std::string& save_dir, int world_size,
                   std::ostream& out) {
  const auto& config = trainer.config();
  const double elapsed = p.elapsed();
  const std::string curve =
      log.write_curve(train::loss_curve_title(config.model, trainer.strategy().to_string()), o.logging.loss_axis == "log");
  const auto& rec = log.records();
  const int64_t step = trainer.steps_done();
  out << (p.bar_open ? "\n" : "")
      << (agreed_stop() ? fmt::format("interrupted ({}): {} of {} in {}", signal_name(agreed_stop()), step,
                                      counted(config.optimizer.steps, "step"), duration_text(elapsed))
                        : fmt::format("done: {} in {}", counted(step, "step"), duration_text(elapsed)))
      << fmt::format(", loss {:.4f} -> {:.4f}, {:.0f} tokens/s", rec.front().step.loss, rec.back().step.loss,
                     static_cast<double>(p.tokens) / elapsed);
  if (p.best >= 0) out << fmt::format(", held-out exact match {:.1f}% (best {:.1f}%)", 100 * p.last_acc, 100 * p.best);
  if (p.last_val >= 0) out << fmt::format(", validation loss {:.4f} (perplexity {:.2f})", p.last_val, std::exp(p.last_val));
  double waited = 0, read = 0;
  for (const train::StepRecord& r : rec) waited += r.step.loader_wait_s, read += r.step.loader_read_s;
  const double per_step = 1e3 / static_cast<double>(rec.size());
  out << fmt::format("\n  loader: {:.2f} ms blocked on data per step, the longest rank's ({:.2f} ms waiting for the read; {})",
                     waited * per_step, read * per_step, config.data.loader_prefetch ? "prefetch" : "no prefetch");
  if (trainer.skipped_steps() > 0) {
    out << fmt::format("\n  skipped {} with a non-finite loss or gradient norm (--skip-nonfinite-steps)",
                       counted(trainer.skipped_steps(), "step"));
  }
  out << fmt::format("\n  metrics: {}\n  loss curve: {}\n", log.jsonl_path(), curve);
  if (!agreed_stop()) return;
  const auto saved = ckpt::list_checkpoints(save_dir);
  if (saved.empty()) {
    out << "  no checkpoint to resume from: --save-every N (or --save-on-interrupt) keeps one\n";
  } else {
    out << fmt::format("  newest checkpoint: {} (step {})\n  resume with: {}\n", saved.back().dir.string(),
                       saved.back().step,
                       resume_command(o.command_line, run_dir, comm::launched_by_mpirun() ? world_size : 0));
  }
}

}  // namespace

struct RankRun::State {
  State(const TrainOptions& options, const train::TrainConfig& c, comm::Communicator& w_ref,
        std::shared_ptr<comm::Communicator> w, std::ostream& o_out, StepHook hook)
      : o(options), config(c), world_ref(w_ref), world(std::move(w)), out(o_out), on_step(std::move(hook)),
        threads(options.kernel_threads), report(w_ref.rank() == 0) {}
  TrainOptions o;
  train::TrainConfig config;
  comm::Communicator& world_ref;
  std::shared_ptr<comm::Communicator> world;
  std::ostream& out;
  StepHook on_step;
  RankThreads threads;  // this rank's kernel threads (tensor/parallel.h)
  bool report;          // rank 0 reports
  std::unique_ptr<runtime::RankProfile> profile;
  std::unique_ptr<train::Trainer> trainer;
  train::ParameterCounts counts;
  std::string run_dir, save_dir;
  bool nothing_to_do = false, stopped = false, finished = false;
  std::unique_ptr<train::CheckpointSchedule> checkpoints;
  std::unique_ptr<train::MetricsLog> log;
  std::unique_ptr<ProgressPrinter> printer;
  Progress p;
  int64_t first_step = 0, saved_step = -1;  // saved_step: the step of the newest save this run made
};

RankRun::RankRun(const TrainOptions& options, const train::TrainConfig& config, comm::Communicator& world_ref,
                 std::shared_ptr<comm::Communicator> world_in, std::ostream& out_in, StepHook on_step)
    : s_(std::make_unique<State>(options, config, world_ref, std::move(world_in), out_in, std::move(on_step))) {
  State& s = *s_;
  const TrainOptions& o = s.o;
  std::ostream& out = s.out;
  // --profile: the Trainer's collectives go through a recording communicator; events are kept
  // only while a training step runs (runtime/profiler.h).
  if (o.logging.profile) s.profile = std::make_unique<runtime::RankProfile>(world_ref.rank());
  if (s.profile) s.profile->set_device(config.device);
  if (s.profile) s.world = std::make_shared<runtime::ProfiledCommunicator>(s.world);
  s.trainer = std::make_unique<train::Trainer>(config, s.world);
  train::Trainer& trainer = *s.trainer;
  comm::Communicator& world = *s.world;
  trainer.set_run_options(o.given);  // its checkpoints keep them (run_options.json)
  s.counts = trainer.count_parameters();  // collective
  if (!o.checkpoint.init_from.empty()) {
    const int64_t n = raising(ErrorKind::Checkpoint,
                              [&] { return train::init_from_model(trainer, world, o.checkpoint.init_from, o.checkpoint.ignore_keys); });
    if (s.report) out << fmt::format("  weights from {} ({} tensors{}); dropout {}\n", o.checkpoint.init_from, n,
                                     o.checkpoint.ignore_keys.empty() ? "" : fmt::format(", skipping {}", fmt::join(o.checkpoint.ignore_keys, " ")),
                                     config.dropout);
    if (s.report && config.init_vocab > 0 && config.init_vocab < config.model.vocab)
      out << fmt::format("  vocabulary grown from {} to {} tokens ({}): the added rows drawn around the old rows' "
                         "mean, as transformers' resize_token_embeddings\n", config.init_vocab, config.model.vocab,
                         o.checkpoint.resize_vocab > 0 ? "--resize-vocab" : "the tokenizer's added tokens");
  }
  if (!o.checkpoint.lora_from.empty()) {
    const int64_t n = raising(ErrorKind::Checkpoint, [&] { return train::load_adapter(trainer, world, o.checkpoint.lora_from); });
    if (s.report) out << fmt::format("  adapters from {} ({} tensors)\n", o.checkpoint.lora_from, n);
  }
  if (config.model.lora.enabled() && s.report)
    out << lora_line(config.model, s.counts, trainer.optimizer_state_bytes());
  std::vector<std::string> notes;
  s.run_dir = choose_run_dir(o, config, world_ref, notes);
  s.save_dir = o.checkpoint.save_dir.empty() ? s.run_dir + "/checkpoints" : o.checkpoint.save_dir;
  const bool saves = o.checkpoint.save_every > 0 || o.checkpoint.save_on_interrupt;
  train::RunDirs dirs{s.run_dir, s.save_dir, saves, !o.checkpoint.resume.empty(), o.checkpoint.save_model_only};
  for (const auto& line : train::check_run_dirs(trainer, world, dirs)) notes.push_back(line);
  train::ResumeResult resumed = raising(ErrorKind::Checkpoint, [&] {
    return train::resume_trainer(trainer, world, o.checkpoint.resume, s.save_dir, !o.checkpoint.no_verify_resume, saves,
                                 o.checkpoint.skip_optimizer);
  });
  notes.insert(notes.end(), resumed.lines.begin(), resumed.lines.end());
  if (resumed.dir) notes.insert(notes.end(), o.resume_notes.begin(), o.resume_notes.end());
  for (const auto& line : notes) {
    if (s.report) out << "  " << line << "\n";
  }
  s.nothing_to_do = resumed.nothing_to_do;
  if (s.nothing_to_do) return;
  ckpt::SaveOptions save_options;
  save_options.save_total_limit = o.checkpoint.save_total_limit;
  save_options.max_shard_bytes = parse_byte_size(o.checkpoint.max_shard_size);
  s.checkpoints = std::make_unique<train::CheckpointSchedule>(s.save_dir, o.checkpoint.save_every, o.checkpoint.async_save,
                                                              save_options, o.checkpoint.save_model_only);
  if (s.report) {
    s.log = std::make_unique<train::MetricsLog>(s.run_dir, resumed.dir ? trainer.steps_done() : -1);
    if (!s.log->kept_aside().empty()) out << fmt::format("  an earlier run's metrics were moved to {}\n", s.log->kept_aside());
    print_header(trainer, o, s.counts, world_ref, s.run_dir, out);
  }
  const int64_t log_every = o.logging.log_every > 0 ? o.logging.log_every : std::max<int64_t>(1, config.optimizer.steps / 20);
  s.first_step = trainer.steps_done();
  s.printer = std::make_unique<ProgressPrinter>(out, progress_mode(o.logging.progress, out), s.first_step, config.optimizer.steps, log_every);
  if (s.profile) s.profile->start(world_ref);
}

RankRun::~RankRun() = default;

bool RankRun::done() const {
  return s_->nothing_to_do || s_->stopped || s_->finished || s_->trainer->steps_done() >= s_->config.optimizer.steps;
}

train::StepRecord RankRun::step() {
  State& s = *s_;
  SW_CHECK(!done(), "the run has no step left: {} of {} steps done{}", s.trainer->steps_done(), s.config.optimizer.steps,
           s.stopped ? " (stopped by a signal)" : s.finished ? " (finished)" : "");
  const TrainOptions& o = s.o;
  const train::TrainConfig& config = s.config;
  train::Trainer& trainer = *s.trainer;
  train::StepResult last;
  {
    runtime::ProfileScope profiled(s.profile.get(), runtime::EventKind::Step, fmt::format("step {}", trainer.steps_done() + 1));
    runtime::ActiveProfile active(s.profile.get());
    last = trainer.step();
  }
  Progress& p = s.p;
  p.tokens += last.tokens;
  // The addition task's held-out accuracy needs the predictions graph, which a model written in
  // Python does not build (models/custom.h).
  const bool addition = config.data.files.empty() && !config.model.custom;
  std::optional<double> acc, val;
  bool eval_now = (addition || trainer.has_validation()) && o.logging.eval_every > 0 &&
                  (last.step % o.logging.eval_every == 0 || last.step == config.optimizer.steps);
  if (eval_now) {
    // One event, nothing inside: the profile's types are what the training steps spend.
    runtime::ProfileScope profiled(s.profile.get(), runtime::EventKind::Eval, addition ? "evaluate" : "validate");
    if (addition) acc = trainer.evaluate().accuracy();
    if (trainer.has_validation()) val = trainer.validate().loss;
  }
  const double elapsed = p.elapsed(), tps = static_cast<double>(p.tokens) / std::max(elapsed, 1e-9);
  train::StepRecord record{last, elapsed, tps, acc, val, o.device_name, std::nullopt};
  if (!config.device.is_host()) record.device_peak_bytes = device_allocator(config.device).stats().peak_in_use_bytes;
  // Saved after the metrics line: a kill between the two leaves a line that the resume drops, never a gap.
  if (s.report) s.log->add(record);
  const bool due = o.checkpoint.save_every > 0 && (last.step % o.checkpoint.save_every == 0 || last.step == config.optimizer.steps);
  raising(ErrorKind::Checkpoint, [&] {
    s.checkpoints->after_step(trainer, *s.world, o.checkpoint.save_every > 0 && last.step == config.optimizer.steps);
  });
  if (due) s.saved_step = last.step;
  if (s.report && acc) p.best = std::max(p.best, *acc), p.last_acc = *acc;
  if (s.report && val) p.last_val = *val;
  if (s.report) {
    std::string metrics = fmt::format("loss {:.4f}  lr {:.2e}  |g| {:.3f}  {:.0f} tok/s{}", last.loss, last.lr,
                                      last.grad_norm, tps,
                                      p.last_acc >= 0 ? fmt::format("  acc {:.1f}%", 100 * p.last_acc) : "");
    metrics += (p.last_val >= 0 ? fmt::format("  val {:.4f} (ppl {:.2f})", p.last_val, std::exp(p.last_val)) : "") +
               moe_summary(last.moe);
    s.printer->step(progress_text({last.step, s.first_step, config.optimizer.steps, elapsed, metrics}, s.printer->bar()), last.step,
                    eval_now, elapsed);
    p.bar_open = s.printer->bar_open();
    if (s.on_step) s.on_step(record);
  }
  stop_if_asked();  // nothing after the last step: done() then
  return record;
}

// SIGINT / SIGTERM: every rank stops after this step; --save-on-interrupt keeps it.
bool RankRun::stop_if_asked() {
  State& s = *s_;
  if (done() || agree_to_stop(s.world_ref) == 0) return false;
  if (s.o.checkpoint.save_on_interrupt && s.saved_step != s.trainer->steps_done()) {
    raising(ErrorKind::Checkpoint, [&] { s.checkpoints->after_step(*s.trainer, *s.world, true); });
    s.saved_step = s.trainer->steps_done();
  }
  s.stopped = true;
  return true;
}

void check_evaluates(const train::TrainConfig& c) {
  SW_CHECK(!c.model.custom, "evaluate() without a batch is the held-out accuracy of the embedded addition task, "
           "which {} does not answer: evaluate(batch) gives the outputs it marks (nn.output)",
           c.model.custom ? c.model.custom->description : "");
  SW_CHECK(c.data.files.empty(), "evaluate() is the held-out accuracy of the embedded addition task; this run trains on "
           "--data {} (validate() gives its validation loss with --val-data or --val-fraction)", c.data.files);
}

void check_validates(const train::TrainConfig& c) {
  // A model fed batches validates the batches it is handed.
  SW_CHECK(train::fed_batches(c.model) || c.data.has_validation(), "validate() needs a validation set: --val-data or --val-fraction (with --data)");
}

double RankRun::evaluate() {
  check_evaluates(s_->config);
  return s_->trainer->evaluate().accuracy();
}

double RankRun::validate() {
  check_validates(s_->config);
  return s_->trainer->validate().loss;
}

std::map<std::string, Tensor> RankRun::predict(const std::map<std::string, Tensor>& batch) {
  return s_->trainer->predict(batch);
}

std::string RankRun::save() {
  State& s = *s_;
  SW_CHECK(!s.nothing_to_do && !s.finished, "the run is {}: nothing to save", s.finished ? "finished" : "done");
  auto dir = raising(ErrorKind::Checkpoint, [&] { return s.checkpoints->after_step(*s.trainer, *s.world, true); });
  s.saved_step = s.trainer->steps_done();
  return dir ? dir->string() : "";
}

void RankRun::finish() {
  State& s = *s_;
  if (s.nothing_to_do || s.finished) return;
  s.finished = true;
  raising(ErrorKind::Checkpoint, [&] { s.checkpoints->finish(); });  // waits for a background save; raises its error
  // Collective: rank 0 gathers every rank's events for the one trace.
  const runtime::ProfileReport profiled =
      s.profile ? runtime::gather_profile(*s.profile, s.world_ref) : runtime::ProfileReport{};
  if (!s.report) return;
  if (s.checkpoints->stalls().saves > 0)
    s.out << checkpoint_summary(*s.checkpoints, s.save_dir, s.trainer->steps_done());
  if (s.log->records().empty()) return;
  print_summary(s.p, *s.log, *s.trainer, s.o, s.run_dir, s.save_dir, s.world_ref.size(), s.out);
  if (s.profile) report_profile(profiled, s.run_dir, s.out);
}

TrainOutcome RankRun::outcome() const {
  TrainOutcome r{s_->run_dir, s_->save_dir, "", s_->trainer->steps_done()};
  std::error_code ec;
  if (ckpt::fs::is_directory(r.save_dir, ec)) {
    const auto saved = ckpt::list_checkpoints(r.save_dir);
    if (!saved.empty()) r.newest_checkpoint = saved.back().dir.string();
  }
  return r;
}

const train::Trainer& RankRun::trainer() const { return *s_->trainer; }

const std::vector<train::StepRecord>& RankRun::records() const {
  static const std::vector<train::StepRecord> none;
  return s_->log ? s_->log->records() : none;
}

int run_train(const TrainOptions& options, std::ostream& out, const RankRun::StepHook& on_step,
              TrainOutcome* outcome) {
  const PreparedRun run = prepare_train_run(options, out);
  if (run.o.logging.dry_run) return 0;
  // Ctrl-C / SIGTERM from here on: the run stops after the step, saves, summarizes, exits 130.
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  StopSignals signals(!mpi_rank || std::atoi(mpi_rank) == 0);
  run_ranks(run, [&](comm::Communicator& world_ref, std::shared_ptr<comm::Communicator> world) {
    RankRun rank(run.o, run.c, world_ref, std::move(world), out, on_step);
    while (!rank.done()) rank.step();
    rank.finish();
    if (outcome && world_ref.rank() == 0) *outcome = rank.outcome();
  });
  return agreed_stop() != 0 ? kInterruptedExit : 0;
}

int cmd_train(const TrainOptions& options, std::ostream& out) { return run_train(options, out, {}, nullptr); }

}  // namespace shardwise::cli
