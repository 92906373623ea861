// `shardwise train --model llama` from the command line: `--init-from` a transformers Llama
// directory (tests/golden/hf/llama_tiny, written by tools/hf_parity.py) takes the model from its
// config.json and starts from transformers' loss; options that contradict it are refused, a
// shorter --seq is not; Llama options are checked before anything runs. `shardwise generate`
// decodes Llama checkpoints, and examples/llama_tiny.sh runs (2 steps).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::run;

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

std::string args(const fs::path& run_dir, const std::string& extra) {
  return "train --init-from " + kGolden + "/llama_tiny --data " + kGolden + "/llama_tokens.bin --steps 1 " +
         "--global-batch 4 --eval-every 0 --progress none --run-dir " + run_dir.string() + " " + extra;
}

TEST(CliLlama, InitFromTransformersLlamaStartsFromItsLoss) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_llama";
  fs::remove_all(dir);
  auto r = run(args(dir, "--mesh dp=2,tp=2"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Llama (2 kv heads, intermediate 32, rope theta 10000, untied head) 2 layers, hidden 16, "
                       "4 heads, seq 16, vocab 128"),
            std::string::npos) << r.out;
  std::ifstream e(kGolden + "/llama_tiny_expected.json");
  const double want = nlohmann::json::parse(e)["loss"].get<double>();
  std::ifstream m(dir / "metrics.jsonl");
  std::string line;
  std::getline(m, line);
  EXPECT_NEAR(nlohmann::json::parse(line)["loss"].get<double>(), want, 1e-5 * want);
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
}

// MoE options: bad ones exit 2 naming the value; an ep mesh without experts, experts ep does not
// divide, and MoE checkpoints (no layout yet) are refused before training.
TEST(CliLlama, BadMoeOptionsAreRefusedBeforeTraining) {
  const std::string base = "train --model llama --layers 2 --hidden 32 --heads 4 --vocab 128 --seq 10 --digits 2 --steps 1 "
                           "--progress none ";
  const std::pair<std::string, std::string> cases[] = {
      {"--experts 3 --mesh ep=2", "3 experts do not divide over ep=2"},
      {"--mesh ep=2", "has an ep dim but the model has no experts"},
      {"--experts 4 --top-k 5", "--top-k 5 must be in [1, --experts 4]"},
      {"--experts 4 --moe-layers 0,2", "--moe-layers names layer 2"},
      {"--experts 4 --save-every 1", "checkpoints of MoE models are not supported yet"},
  };
  for (const auto& [args, message] : cases) {
    auto r = run(base + args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << ": " << r.out;
  }
  auto r = run("train --model gpt2 --experts 2 --steps 1 --progress none");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("built for --model llama only"), std::string::npos) << r.out;
}

// The new ids of `generate --json` (the line starting with '{').
std::vector<int64_t> generated_ids(const std::string& out) {
  nlohmann::json j;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind('{', 0) == 0) j = nlohmann::json::parse(line);
  return j.contains("sequences") ? j["sequences"][0]["new_ids"].get<std::vector<int64_t>>() : std::vector<int64_t>{};
}

// LoRA is GPT-2's: with a Llama model it is one line naming the combination, before anything
// runs. Packed documents are accepted (their losses: Packing.LlamaWindowOfDocumentsLoses*), and
// `generate` decodes the checkpoint as any other (its config has no packing: prompts are one
// document), the KV cache giving the recomputing path's tokens.
TEST(CliLlama, LoraIsRefusedPackedDocumentsTrain) {
  const fs::path dir = fs::temp_directory_path() / "sw_cli_llama_refused";
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
  r = run(args(dir, "--mesh dp=1 --lora-rank 4"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("LoRA (--lora-rank / --lora-from) with --model llama is not supported"), std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir / "metrics.jsonl"));
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
    if (extra == "mpi") EXPECT_NE(r.out.find("(4 ranks, mpi)"), std::string::npos) << r.out;
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
