// `shardwise train --model llama` from the command line: `--init-from` a transformers Llama
// directory (tests/golden/hf/llama_tiny, written by tools/hf_parity.py) takes the model from its
// config.json and starts from transformers' loss; options that contradict it are refused, a
// shorter --seq is not; Llama options are checked before anything runs. `shardwise generate`
// decodes Llama checkpoints, and examples/llama_tiny.sh runs (2 steps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::run;
using shardwise_cli_test::TempDir;
using shardwise_cli_test::metrics_losses;

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

std::string args(const fs::path& run_dir, const std::string& extra) {
  return "train --init-from " + kGolden + "/llama_tiny --data " + kGolden + "/llama_tokens.bin --steps 1 " +
         "--global-batch 4 --eval-every 0 --progress none --run-dir " + run_dir.string() + " " + extra;
}

// The first loss in run_dir's metrics.jsonl equals transformers' loss in <golden>_expected.json within 1e-5.
void expect_golden_first_loss(const fs::path& run_dir, const std::string& golden) {
  std::ifstream e(kGolden + "/" + golden + "_expected.json");
  const double want = nlohmann::json::parse(e)["loss"].get<double>();
  std::ifstream m(run_dir / "metrics.jsonl");
  std::string line;
  std::getline(m, line);
  EXPECT_NEAR(nlohmann::json::parse(line)["loss"].get<double>(), want, 1e-5 * want) << golden;
}

TEST(CliLlama, InitFromTransformersLlamaStartsFromItsLoss) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_llama";
  fs::remove_all(dir);
  auto r = run(args(dir, "--mesh dp=2,tp=2"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Llama (2 kv heads, intermediate 32, rope theta 10000, untied head) 2 layers, hidden 16, "
                       "4 heads, seq 16, vocab 128"),
            std::string::npos) << r.out;
  expect_golden_first_loss(dir, "llama_tiny");
  fs::remove_all(dir);
}

// --init-from a transformers Mixtral (tools/hf_mixtral.py's golden) takes --experts and --top-k from
// its config.json and starts from transformers' loss on ep=2; an --experts that contradicts it, or
// experts on a dense Llama directory, exit 2.
TEST(CliLlama, InitFromTransformersMixtralTakesItsExpertsAndStartsFromItsLoss) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_mixtral";
  fs::remove_all(dir);
  const std::string mixtral = "train --init-from " + kGolden + "/mixtral_tiny --data " + kGolden +
                              "/mixtral_tokens.bin --steps 1 --global-batch 4 --eval-every 0 --progress none --run-dir " +
                              dir.string() + " ";
  auto r = run(mixtral + "--mesh ep=2");
  ASSERT_EQ(r.status, 0) << r.out;
  expect_golden_first_loss(dir, "mixtral_tiny");
  fs::remove_all(dir);
  r = run(mixtral + "--mesh ep=2 --experts 8");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--experts 8 contradicts --init-from"), std::string::npos) << r.out;
  r = run(args(dir, "--experts 4"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("whose config.json has 0"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(CliLlama, OptionsThatContradictTheDirectoryAreRefusedAShorterSeqIsNot) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_llama_bad";
  fs::remove_all(dir);
  auto r = run(args(dir, "--mesh tp=2 --model gpt2"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--model gpt2 contradicts --init-from"), std::string::npos) << r.out;
  r = run(args(dir, "--mesh tp=2 --kv-heads 4"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--kv-heads 4 contradicts --init-from"), std::string::npos) << r.out;
  r = run(args(dir, "--mesh tp=2 --tied-head"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--tied-head contradicts --init-from"), std::string::npos) << r.out;
  r = run(args(dir, "--mesh tp=2 --seq 32"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("max_position_embeddings; --seq may be shorter"), std::string::npos) << r.out;
  r = run(args(dir, "--mesh tp=2 --seq 8"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("seq 8"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(CliLlama, BadLlamaOptionsAreRefusedBeforeTraining) {
  auto r = run("train --model llama --heads 4 --kv-heads 3 --steps 1 --mesh dp=1 --progress none");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("3 key/value heads must divide the 4 attention heads"), std::string::npos) << r.out;
  r = run("train --model mistral --steps 1 --mesh dp=1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("mistral"), std::string::npos) << r.out;
  // GPT-2's head is always tied: --untied-head is refused (it was accepted and trained tied), in
  // train and in plan, and with --init-from a GPT-2 directory.
  const std::vector<std::string> gpt2 = {
      "train --steps 1 --mesh dp=1 --progress none", "plan --mesh dp=1",
      "train --init-from " + kGolden + "/gpt2_tiny --data " + kGolden + "/tokens.bin --steps 1 --mesh dp=1 --progress none"};
  for (const std::string& cmd : gpt2) {
    r = run(cmd + " --untied-head");
    EXPECT_EQ(r.status, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("--untied-head: GPT-2's LM head is the token embedding (wte)"), std::string::npos)
        << cmd << "\n" << r.out;
  }
  // Llama's other fields were silently ignored on GPT-2 (the run trained another model than it asked
  // for): each is refused by name, in train, in plan and with --init-from a GPT-2 directory. A value
  // GPT-2 has anyway (as many kv heads as heads, n_inner 4 x hidden) is accepted.
  const std::pair<std::string, std::string> llama_only[] = {
      {" --kv-heads 1", "--kv-heads 1: GPT-2's attention has as many key/value heads as heads"},
      {" --intermediate-size 100", "--intermediate-size 100: GPT-2's MLP is 4 x hidden"},
      {" --rope-theta 500000", "--rope-theta 500000: GPT-2 has learned positions (wpe)"},
      {" --rms-norm-eps 1e-5", "--rms-norm-eps 1e-05: GPT-2 normalises with LayerNorm"}};
  for (const std::string& cmd : gpt2)
    for (const auto& [flag, message] : llama_only) {
      r = run(cmd + flag);
      EXPECT_EQ(r.status, 2) << cmd << flag << "\n" << r.out;
      EXPECT_NE(r.out.find(message), std::string::npos) << cmd << flag << "\n" << r.out;
    }
  r = run("plan --mesh dp=1 --heads 4 --kv-heads 4 --hidden 64 --intermediate-size 256");
  EXPECT_EQ(r.status, 0) << r.out;
}

// MoE options: bad ones exit 2 naming the value; an ep mesh without experts, experts ep does not
// divide, and checkpoints of a sigmoid router or a shared expert (Mixtral's layout has neither) are
// refused before training.
TEST(CliLlama, BadMoeOptionsAreRefusedBeforeTraining) {
  const std::string base = "train --model llama --layers 2 --hidden 32 --heads 4 --vocab 128 --seq 10 --digits 2 --steps 1 "
                           "--progress none ";
  const std::pair<std::string, std::string> cases[] = {
      {"--experts 3 --mesh ep=2", "3 experts do not divide over ep=2"},
      {"--mesh ep=2", "has an ep dim but the model has no experts"},
      {"--experts 4 --top-k 5", "--top-k 5 must be in [1, --experts 4]"},
      {"--experts 4 --moe-layers 0,2", "--moe-layers names layer 2"},
      {"--experts 4 --router relu", "relu not in {softmax,sigmoid}"},
      {"--shared-expert-width 8", "--shared-expert-width 8 needs --experts"},
      {"--experts 4 --aux-loss-scope all", "all not in {layer,model}"},
      {"--experts 4 --router sigmoid --aux-loss 0.01 --aux-loss-scope model", "transformers' loss of softmax routers"},
      {"--experts 4 --aux-loss 0.01 --aux-loss-scope model --mesh pp=2", "every layer must be on one pipeline stage"},
      {"--experts 4 --router sigmoid --save-every 1", "Mixtral's layout, which has a softmax router and no shared expert"},
      {"--experts 4 --shared-expert-width 8 --resume /nonexistent", "--router softmax --shared-expert-width 8: checkpoints"},
      // ep is a data dim: the global batch splits over dp x ep
      {"--experts 4 --mesh dp=2,ep=2 --global-batch 6 --micro-batch 1",
       "global batch 6 is not a multiple of micro-batch 1 x dp x ep 4"},
  };
  for (const auto& [args, message] : cases) {
    auto r = run(base + args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << ": " << r.out;
  }
  // The exchange setting is read before training too.
  auto r = shardwise_cli_test::run_command("SHARDWISE_MOE_EXCHANGE=bogus $SHARDWISE_BIN " + base + "--experts 4");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("SHARDWISE_MOE_EXCHANGE=bogus: the MoE exchange is 'messages' or 'shared'"), std::string::npos) << r.out;
  r = run("train --model gpt2 --experts 2 --steps 1 --progress none");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("built for --model llama only"), std::string::npos) << r.out;
}

// A model with a dense layer among MoE ones (--moe-layers 1 of 2) saves as model_type
// shardwise_mixtral with mlp_only_layers [0], resumes on ep=2, and --init-from takes its MoE layers
// (a --moe-layers that contradicts them is refused naming both).
TEST(CliLlama, DenseLayersAmongMoeOnesSaveResumeOnAnotherMeshAndInitFrom) {
  shardwise_cli_test::TempDir d("sw_cli_llama_partial_moe");
  const std::string base = "train --model llama --layers 2 --hidden 32 --heads 4 --vocab 128 --seq 10 --digits 2 "
                           "--experts 4 --progress none --eval-every 0 ";
  const std::filesystem::path ckpt = d.path / "a" / "checkpoints" / "checkpoint-2";
  auto r = run(base + "--moe-layers 1 --steps 2 --save-every 2 --run-dir " + (d.path / "a").string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream f(ckpt / "config.json");
  const nlohmann::json config = nlohmann::json::parse(f);
  EXPECT_EQ(config["model_type"], "shardwise_mixtral");
  EXPECT_EQ(config["mlp_only_layers"], nlohmann::json::array({0}));
  r = run(base + "--moe-layers 1 --steps 3 --mesh ep=2 --resume " + ckpt.string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + ckpt.string() + " at step 2"), std::string::npos) << r.out;
  const std::string init = "train --init-from " + ckpt.string() + " --digits 2 --steps 1 --progress none --eval-every 0 ";
  r = run(init + "--mesh dp=2 --run-dir " + (d.path / "b").string());
  EXPECT_EQ(r.status, 0) << r.out;
  r = run(init + "--moe-layers 0,1 --run-dir " + (d.path / "c").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--moe-layers 0,1 contradicts --init-from"), std::string::npos) << r.out;
}

// An MoE run's metrics.jsonl carries each MoE layer's router figures per step and its lines the
// worst imbalance; `plan --memory` shows the step's all-to-alls and their bytes.
TEST(CliLlama, MoeRunsReportTheirRoutersAndPlanTheirAllToAlls) {
  const std::string model = "--model llama --layers 2 --hidden 32 --heads 4 --vocab 128 --seq 10 --digits 2 "
                            "--experts 4 --top-k 2 --global-batch 8 --eval-every 0 --mesh ep=2 ";
  const fs::path dir = fs::temp_directory_path() / "shardwise_moe_metrics";
  fs::remove_all(dir);
  auto r = run("train " + model + "--steps 2 --capacity-factor 0.5 --progress lines --run-dir " + dir.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("moe max/mean "), std::string::npos) << r.out;
  std::ifstream f(dir / "metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    ASSERT_EQ(j["moe"].size(), 2u) << line;
    for (const auto& m : j["moe"]) {
      EXPECT_EQ(m["tokens_per_expert_mean"].get<double>(), 8 * 10 * 2 / 4.0) << line;  // batch tokens x top-2 / 4
      EXPECT_LE(m["tokens_per_expert_min"].get<double>(), m["tokens_per_expert_mean"].get<double>()) << line;
      EXPECT_GE(m["tokens_per_expert_max"].get<double>(), m["tokens_per_expert_mean"].get<double>()) << line;
      EXPECT_GE(m["dropped"].get<int64_t>(), 0) << line;
      EXPECT_GT(m["aux_loss"].get<double>(), 0.0) << line;
      EXPECT_GT(m["z_loss"].get<double>(), 0.0) << line;
    }
    ++steps;
  }
  EXPECT_EQ(steps, 2);
  fs::remove_all(dir);
  r = run("plan --memory " + model);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("moe traffic per step and rank: 2 MoE layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_to_all_v x"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("assuming uniform routing"), std::string::npos) << r.out;
  // The plan's count is what a profiled step makes: each of the 2 ranks its all_to_all_v calls.
  r = run("plan --memory --json " + model);
  ASSERT_EQ(r.status, 0) << r.out;
  const int64_t planned = nlohmann::json::parse(r.out.substr(r.out.find('{')))["moe_traffic"]["all_to_all_v"];
  EXPECT_EQ(planned, 2 * 1 * 4);  // 2 MoE layers x 1 micro-batch x 4
  // The message exchange, and on threads the default, through shared memory (recorded alike).
  for (const char* path : {"messages", ""}) {
    ::setenv("SHARDWISE_MOE_EXCHANGE", path, 1);
    r = run("train " + model + "--steps 1 --progress none --profile --run-dir " + dir.string());
    ::unsetenv("SHARDWISE_MOE_EXCHANGE");
    ASSERT_EQ(r.status, 0) << r.out;
    const size_t at = r.out.find("collective all_to_all ");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_EQ(std::stoll(r.out.substr(at + std::string("collective all_to_all ").size())), 2 * planned) << path << r.out;
    fs::remove_all(dir);
  }
}

// The new ids of `generate --json` (the line starting with '{').
std::vector<int64_t> generated_ids(const std::string& out) {
  nlohmann::json j;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind('{', 0) == 0) j = nlohmann::json::parse(line);
  return j.contains("sequences") ? j["sequences"][0]["new_ids"].get<std::vector<int64_t>>() : std::vector<int64_t>{};
}

// Packed documents are accepted (their losses: Packing.LlamaWindowOfDocumentsLoses*), and
// `generate` decodes the checkpoint as any other (its config has no packing: prompts are one
// document), the KV cache giving the recomputing path's tokens.
TEST(CliLlama, PackedDocumentsTrainAndGenerate) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_llama_packed";
  fs::remove_all(dir);
  auto r = run(args(dir, "--mesh dp=2 --eos-id 0 --no-cross-document-attention --save-every 1"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("packing: documents end at id 0"), std::string::npos) << r.out;
  const std::string gen = "generate --checkpoint " + (dir / "checkpoints" / "checkpoint-1").string() +
                          " --prompt-ids 5,9,17 --max-new-tokens 6 --mesh tp=2 --json";
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<int64_t> cached = generated_ids(r.out);
  EXPECT_EQ(cached.size(), 6u) << r.out;
  r = run(gen + " --no-kv-cache");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(generated_ids(r.out), cached);
  fs::remove_all(dir);
}

// `shardwise generate` on a transformers Llama directory: transformers' greedy tokens (its eos
// 127), with and without the KV cache, on dp=2 x tp=2 as threads and as 4 MPI processes.
TEST(CliLlama, GenerateGivesTransformersGreedyTokens) {
  std::ifstream e(kGolden + "/llama_tiny_expected.json");
  const nlohmann::json want = nlohmann::json::parse(e);
  const auto prompt = want["greedy_prompt"].get<std::vector<int64_t>>();
  const auto all = want["greedy"].get<std::vector<int64_t>>();
  std::string ids;
  for (int64_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string mpi = std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " ";
  for (const std::string extra : {"", " --no-kv-cache", "mpi"}) {
    const std::string cmd = "generate --checkpoint " + kGolden + "/llama_tiny --prompt-ids " + ids +
                            " --max-new-tokens 8 --mesh dp=2,tp=2 --json" + (extra == "mpi" ? "" : extra);
    auto r = extra == "mpi" ? shardwise_cli_test::run_command(mpi + cmd) : run(cmd);
    ASSERT_EQ(r.status, 0) << r.out;
    nlohmann::json j;  // the line starting with '{' (under mpirun, stderr may come first)
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind('{', 0) == 0) j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("sequences")) << extra << ": " << r.out;
    EXPECT_EQ(j["sequences"][0]["new_ids"].get<std::vector<int64_t>>(),
              std::vector<int64_t>(all.begin() + static_cast<int64_t>(prompt.size()), all.end()))
        << extra;
    if (extra == "mpi") { EXPECT_NE(r.out.find("(4 ranks, mpi)"), std::string::npos) << r.out; }
  }
}

// examples/llama_tiny.sh (`make llama-demo`) with 2 training steps: a SentencePiece model trained
// on the fables, `train --config examples/llama_tiny.toml --tokenizer ...` (a Llama with GQA and
// an untied head on tp=2), then `generate --tokenizer` prints the decoded continuation of "The fox".
TEST(CliLlama, TheLlamaTinyExampleTokenizesTrainsAndGeneratesText) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_llama_example";
  fs::remove_all(dir);
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  auto r = shardwise_cli_test::run_command("bash " + std::string(SHARDWISE_SOURCE_DIR) + "/examples/llama_tiny.sh " +
                                           bin + " " + dir.string() + " --steps 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Llama (2 kv heads, intermediate 256, rope theta 10000, untied head)"), std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(dir / "tokenizer.model"));
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "checkpoint-2" / "config.json"));
  // The decoded text: the prompt, then the continuation, on the line after the generate command.
  const size_t cmd = r.out.find("--prompt The fox");
  ASSERT_NE(cmd, std::string::npos) << r.out;
  const size_t line = r.out.find('\n', cmd) + 1;
  EXPECT_EQ(r.out.substr(line, 7), "The fox") << r.out;
  EXPECT_GT(r.out.find('\n', line) - line, 7u) << "no continuation: " << r.out;
  EXPECT_NE(r.out.find("shardwise generate: "), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace

namespace {

// The shape of `key` in a safetensors file's header.
std::vector<int64_t> stored_shape(const fs::path& file, const std::string& key) {
  std::ifstream in(file, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  return nlohmann::json::parse(header).at(key).at("shape").get<std::vector<int64_t>>();
}

}  // namespace

// --head-dim: a Llama whose heads are not hidden / heads wide (as Qwen3's are) trains from scratch,
// saves q_proj [heads x head-dim, hidden] and head_dim in config.json, and --init-from takes it
// from there. An explicit head-dim equal to hidden / heads is the same model bit for bit.
TEST(CliLlama, AHeadDimOfItsOwnTrainsSavesAndInitsFrom) {
  TempDir d("head-dim");
  const std::string base = "train --model llama --layers 1 --heads 4 --kv-heads 2 --vocab 128 --seq 10 --digits 2 "
                           "--steps 2 --global-batch 4 --mesh dp=2 --eval-every 0 --progress none --run-dir ";
  auto r = run(base + (d.path / "wide").string() + " --hidden 48 --head-dim 16 --save-every 2");
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path ckpt = d.path / "wide" / "checkpoints" / "checkpoint-2";
  std::ifstream config(ckpt / "config.json");
  EXPECT_EQ(nlohmann::json::parse(config)["head_dim"], 16);
  EXPECT_EQ(stored_shape(ckpt / "model-00001-of-00001.safetensors", "model.layers.0.self_attn.q_proj.weight"),
            (std::vector<int64_t>{64, 48}));
  EXPECT_EQ(stored_shape(ckpt / "model-00001-of-00001.safetensors", "model.layers.0.self_attn.k_proj.weight"),
            (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(stored_shape(ckpt / "model-00001-of-00001.safetensors", "model.layers.0.self_attn.o_proj.weight"),
            (std::vector<int64_t>{48, 64}));
  const std::string from = "train --init-from " + ckpt.string() + " --steps 1 --global-batch 4 --seq 10 --digits 2 "
                           "--mesh tp=2 --eval-every 0 --progress none --run-dir ";
  r = run(from + (d.path / "again").string());
  EXPECT_EQ(r.status, 0) << r.out;
  r = run(from + (d.path / "other").string() + " --head-dim 8");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--head-dim 8 contradicts --init-from"), std::string::npos) << r.out;
  r = run(base + (d.path / "plain").string() + " --hidden 64");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(base + (d.path / "explicit").string() + " --hidden 64 --head-dim 16");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(metrics_losses(d.path / "explicit" / "metrics.jsonl"), metrics_losses(d.path / "plain" / "metrics.jsonl"));
  r = run("train --head-dim 16 --steps 1 --mesh dp=1 --progress none");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--head-dim 16: GPT-2's heads are hidden / heads wide"), std::string::npos) << r.out;
}
