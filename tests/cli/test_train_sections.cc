// The train command's options come in sections (--help's groups, a config file's [model] ...
// [logging] tables: cli/train/train_options.cc train_option_sections), and so does the configuration
// they fill (train/train_config.h TrainConfig, cli/commands.h TrainOptions). Each option given
// alone must change its own section's struct and no other, so the two groupings cannot drift.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "shardwise/cli/train/train_options.h"
#include "shardwise/cli/train/train_run.h"

namespace {

using shardwise::cli::TrainOptions;

// Which sections differ between two parses.
std::set<std::string> changed_sections(const TrainOptions& a, const TrainOptions& b) {
  std::set<std::string> out;
  const auto& x = a.config;
  const auto& y = b.config;
  if (!(x.model == y.model) || x.dropout != y.dropout || x.bf16 != y.bf16) out.insert("model");
  if (!(x.parallel == y.parallel) || a.ranks != b.ranks || a.gemm != b.gemm || a.device != b.device ||
      a.memory_limit != b.memory_limit || a.auto_plan != b.auto_plan)
    out.insert("parallel");
  if (!(x.optimizer == y.optimizer) || a.epochs != b.epochs || a.tokens != b.tokens) out.insert("optimizer");
  if (!(x.data == y.data)) out.insert("data");
  if (!(a.checkpoint == b.checkpoint)) out.insert("checkpoint");
  if (!(a.logging == b.logging)) out.insert("logging");
  return out;
}

// A value other than the default for each option that takes one ("" for a flag).
const std::map<std::string, std::string>& values() {
  static const std::string fables = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";
  static const std::map<std::string, std::string> v = {
      {"model", "llama"}, {"layers", "3"}, {"heads", "2"}, {"hidden", "64"}, {"seq", "32"}, {"vocab", "256"},
      {"kv-heads", "2"}, {"head-dim", "16"}, {"intermediate-size", "96"}, {"tied-head", "--untied-head"}, {"rope-theta", "500000"},
      {"rms-norm-eps", "1e-5"}, {"experts", "4"}, {"top-k", "1"}, {"moe-layers", "1"}, {"aux-loss", "0.01"},
      {"aux-loss-scope", "model"}, {"router-z-loss", "0.001"}, {"capacity-factor", "1.5"}, {"router", "sigmoid"},
      {"shared-expert-width", "32"}, {"dropout", "0.1"}, {"bf16", ""}, {"compute", "bf16"}, {"recompute", "full"},
      {"recompute-layers", "1"}, {"attention", "unfused"}, {"cp-attention", "gather"}, {"lm-head", "unfused"}, {"lora-rank", "4"},
      {"lora-alpha", "16"}, {"lora-targets", "c_proj"}, {"lora-dropout", "0.1"}, {"lora-rslora", ""},
      {"auto", ""}, {"mesh", "dp=4"}, {"ranks", "4"}, {"sp", ""}, {"schedule", "fthenb"}, {"virtual", "2"},
      {"micro-batches", "4"}, {"sharding-stage", "1"}, {"sharding-layout", "v2"}, {"prefetch-params", "1"},
      {"overlap-grad-reduce", "on"}, {"grad-bucket-mb", "8"}, {"gemm", "openblas"}, {"device", "fake"}, {"memory-limit", "none"},
      {"steps", "9"}, {"epochs", "2"}, {"tokens", "4096"}, {"global-batch", "32"}, {"micro-batch", "4"},
      {"accumulation", "2"}, {"lr", "0.001"}, {"min-lr", "0.00001"}, {"warmup", "5"}, {"weight-decay", "0.1"},
      {"beta1", "0.8"}, {"beta2", "0.99"}, {"clip", "0.5"}, {"seed", "7"}, {"skip-nonfinite-steps", ""},
      {"data", fables}, {"data-format", "bytes"}, {"tokenizer", "tok.model"}, {"documents", "lines"},
      {"document-separator", "<|end|>"}, {"eos-id", "10"}, {"no-cross-document-attention", ""},
      {"no-prefetch", ""}, {"val-data", fables}, {"val-fraction", "0.1"}, {"val-samples", "8"}, {"digits", "2"},
      {"eval-samples", "16"}, {"save-every", "5"}, {"save-dir", "ckpts"}, {"save-total-limit", "2"},
      {"async-save", ""}, {"save-on-interrupt", ""}, {"max-shard-size", "1GB"}, {"resume", "auto"},
      {"no-verify-resume", ""}, {"save-model-only", ""}, {"skip-optimizer", ""}, {"init-from", std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/gpt2_tiny"}, {"ignore-keys", "lm_head.*"}, {"resize-vocab", "320"}, {"lora-from", "adapter-dir"},
      {"run-dir", "runs/x"}, {"eval-every", "10"}, {"log-every", "2"}, {"progress", "lines"},
      {"loss-axis", "linear"}, {"profile", ""}, {"dry-run", ""}, {"json", ""},
  };
  return v;
}

// What an option needs beside it, and the sections an option changes by design beyond its own.
struct Context {
  std::vector<std::string> args;  // given in the reference parse too
  std::set<std::string> also;     // other sections it changes, and why (the comment)
  bool not_its_own = false;       // it changes `also` only (an alias of another section's option)
};
const std::map<std::string, Context>& contexts() {
  static const std::string fables = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";
  static const std::string gpt2 = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/gpt2_tiny";
  // The steps and the vocabulary are given, so that --data does not derive them (data_defaults.h).
  static const std::vector<std::string> data = {"--data", fables, "--steps", "3", "--vocab", "512"};
  static const std::vector<std::string> lora = {"--init-from", gpt2, "--lora-rank", "4"};
  static const std::map<std::string, Context> c = {
      {"data", {{"--steps", "3", "--vocab", "512"}, {}}},
      {"val-data", {data, {}}},
      {"val-fraction", {data, {}}},
      {"val-samples", {data, {}}},
      {"data-format", {data, {}}},
      // --epochs and --tokens are how many steps: the optimizer's steps.
      {"epochs", {{"--data", fables, "--vocab", "512"}, {}}},
      {"tokens", {{"--data", fables, "--vocab", "512"}, {}}},
      // --init-from takes the model's configuration from the directory's config.json.
      {"init-from", {{}, {"model"}}},
      {"ignore-keys", {{"--init-from", gpt2}, {}}},
      // --resize-vocab grows the --init-from model's vocabulary (the model's --vocab).
      {"resize-vocab", {{"--init-from", gpt2}, {"model"}}},
      {"lora-rank", {{"--init-from", gpt2}, {}}},
      {"lora-alpha", {lora, {}}},
      {"lora-targets", {lora, {}}},
      {"lora-dropout", {lora, {}}},
      {"lora-rslora", {lora, {}}},
      // --micro-batches is the pipeline's name for --accumulation (the optimizer's batch split),
      // listed with the pipeline's options.
      {"micro-batches", {{}, {"optimizer"}, true}},
  };
  return c;
}

// Options read when the command line is parsed that need a file this test does not make.
const std::map<std::string, std::string>& not_parsed_here() {
  static const std::map<std::string, std::string> why = {
      {"tokenizer", "opens the SentencePiece model at parse time (CliDataDefaults covers it)"},
      {"documents", "needs --tokenizer"},
      {"document-separator", "needs --tokenizer"},
      {"lora-from", "reads a PEFT adapter directory at parse time (CliLora covers it)"},
      {"resume", "reads the checkpoint's run_options.json at parse time (CliRunOptions covers it)"},
  };
  return why;
}

TEST(TrainSections, EveryOptionChangesOnlyItsOwnSection) {
  size_t checked = 0;
  for (const shardwise::cli::OptionSection& section : shardwise::cli::train_option_sections()) {
    for (std::string_view key : section.options) {
      const std::string name(key);
      if (not_parsed_here().count(name)) continue;
      auto value = values().find(name);
      ASSERT_NE(value, values().end()) << "--" << name << " needs a value in values()";
      auto context = contexts().find(name);
      std::vector<std::string> args = context == contexts().end() ? std::vector<std::string>{} : context->second.args;
      std::set<std::string> want = {std::string(section.key)};
      if (context != contexts().end()) {
        if (context->second.not_its_own) want.clear();
        want.insert(context->second.also.begin(), context->second.also.end());
      }
      TrainOptions plain, o;
      try {
        plain = shardwise::cli::parse_train_args(args).options;
        args.push_back(value->second.rfind("--", 0) == 0 ? value->second : "--" + name);
        if (!value->second.empty() && value->second.rfind("--", 0) != 0) args.push_back(value->second);
        o = shardwise::cli::parse_train_args(args).options;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "--" << name << " " << value->second << ": " << e.what();
        continue;
      }
      EXPECT_EQ(changed_sections(plain, o), want) << "--" << name << " " << value->second << " is listed under ["
                                                  << section.key << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, values().size() - not_parsed_here().size());
}

}  // namespace
