// `shardwise generate` from a checkpoint that `shardwise train` saved: the output format (text for a
// byte vocabulary, --json), the same tokens on every mesh, with and without the KV cache, under
// mpirun, and the errors (exit status 2, one line naming the problem). The tokens themselves are
// checked against an independent reference in tests/generate/test_generate.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "json_line.h"
#include "run_cli.h"

namespace {

namespace fs = std::filesystem;

using shardwise_cli_test::Result;
using shardwise_cli_test::run;

// A directory of this test process (ctest runs tests in parallel processes), removed at exit.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
};

// A 1-layer model after 3 steps of 2-digit addition (seq 9), saved once per test process.
const fs::path& checkpoint() {
  static const ScratchDir scratch("sw_cli_generate");
  static const fs::path dir = [] {
    const fs::path& root = scratch.path;
    Result r = run("train --layers 1 --hidden 32 --heads 4 --digits 2 --global-batch 8 --eval-every 0 --steps 3 "
                   "--save-every 3 --progress none --run-dir " + root.string());
    EXPECT_EQ(r.status, 0) << r.out;
    return root / "checkpoints" / "checkpoint-3";
  }();
  return dir;
}

std::string generate(const std::string& args) { return "generate --checkpoint " + checkpoint().string() + " " + args; }

// The JSON object of a --json run: its line starting with '{' (the summary goes to stderr after it,
// but under mpirun the forwarded stderr may arrive first).
using shardwise_cli_test::json_of;

std::vector<std::vector<int64_t>> new_ids(const nlohmann::json& j) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& s : j["sequences"]) out.push_back(s["new_ids"].get<std::vector<int64_t>>());
  return out;
}

TEST(CliGenerate, PrintsEachPromptWithItsContinuation) {
  Result r = run(generate("--prompt 12+34= --prompt 5+6= --max-new-tokens 3 --eos-id -1"));
  ASSERT_EQ(r.status, 0) << r.out;
  std::istringstream lines(r.out);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  EXPECT_EQ(first.rfind("12+34=", 0), 0u) << r.out;
  EXPECT_EQ(second.rfind("5+6=", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("6 new tokens for 2 prompts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
}

TEST(CliGenerate, JsonHoldsIdsTextStopReasonsAndTimings) {
  Result r = run(generate("--prompt-ids '49,50,43;51' --max-new-tokens 4 --eos-id -1 --json"));
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = json_of(r);
  ASSERT_EQ(j["sequences"].size(), 2u) << r.out;
  EXPECT_EQ(j["sequences"][0]["prompt_ids"], nlohmann::json({49, 50, 43}));
  EXPECT_EQ(j["sequences"][0]["prompt"], "12+");
  EXPECT_EQ(j["sequences"][1]["new_ids"].size(), 4u);
  EXPECT_EQ(j["sequences"][1]["stop"], "max_new_tokens");
  EXPECT_EQ(j["kv_cache"], true);
  // The timings' counts are exact (2 prompts x 4 new tokens, the first of each from the prefill;
  // with the cache, one graph run per new token) and the rates are those counts over the times.
  const nlohmann::json& st = j["stats"];
  EXPECT_EQ(st["new_tokens"], 8) << st;
  EXPECT_EQ(st["decode_tokens"], 6) << st;
  EXPECT_EQ(st["steps"], 4) << st;
  for (const char* t : {"plan_seconds", "prefill_seconds", "decode_seconds"}) EXPECT_GE(st[t].get<double>(), 0.0) << t;
  const double prefill = st["prefill_seconds"], decode = st["decode_seconds"];
  EXPECT_DOUBLE_EQ(st["tokens_per_second"].get<double>(), prefill + decode > 0 ? 8 / (prefill + decode) : 0) << st;
  EXPECT_DOUBLE_EQ(st["decode_tokens_per_second"].get<double>(), decode > 0 ? 6 / decode : 0) << st;
}

TEST(CliGenerate, EveryMeshAndTheRecomputingPathGiveTheSameTokens) {
  const std::string args = "--prompt 12+34= --prompt 7+8= --prompt 99+1= --max-new-tokens 4 --eos-id -1 --json ";
  Result ref = run(generate(args));
  ASSERT_EQ(ref.status, 0) << ref.out;
  for (const std::string extra : {"--mesh tp=2", "--mesh dp=2", "--mesh dp=2,tp=2 --no-kv-cache", "--mesh dp=2,tp=2"}) {
    Result r = run(generate(args + extra));
    ASSERT_EQ(r.status, 0) << extra << ": " << r.out;
    EXPECT_EQ(new_ids(json_of(r)), new_ids(json_of(ref))) << extra;
  }
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  Result mpi = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 4 " + bin + " " +
                                               generate(args + "--mesh dp=2,tp=2"));
  ASSERT_EQ(mpi.status, 0) << mpi.out;
  EXPECT_EQ(new_ids(json_of(mpi)), new_ids(json_of(ref)));
  EXPECT_NE(mpi.out.find("(4 ranks, mpi)"), std::string::npos) << mpi.out;
}

// Two MPI processes as the stages of pp=2 (each loads its stage's layers and passes the hidden
// states on) give the one-rank tokens, which are transformers' greedy tokens (the goldens'
// greedy, tools/hf_parity.py and tools/hf_mixtral.py): a Llama, and a Mixtral whose experts each
// stage holds whole.
TEST(CliGenerate, APipelineMeshOfTwoMpiProcessesGivesTheOneRankTokens) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  const std::string golden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/";
  for (const std::string name : {"llama_tiny", "mixtral_tiny"}) {
    const shardwise_cli_test::GoldenGreedy want = shardwise_cli_test::golden_greedy(golden, name);
    const std::string args = "generate --checkpoint " + golden + name + " --prompt-ids " + want.prompt_ids +
                             " --max-new-tokens 8 --json ";
    Result one = run(args);
    ASSERT_EQ(one.status, 0) << one.out;
    Result mpi = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 " + bin + " " + args +
                                                 "--mesh pp=2");
    ASSERT_EQ(mpi.status, 0) << mpi.out;
    EXPECT_NE(mpi.out.find("\"mesh\":\"[pp=2]\""), std::string::npos) << mpi.out;
    EXPECT_NE(mpi.out.find("2 ranks, mpi"), std::string::npos) << mpi.out;
    EXPECT_EQ(new_ids(json_of(mpi)), new_ids(json_of(one))) << name;
    std::vector<int64_t> greedy = want.prompt;
    const std::vector<std::vector<int64_t>> got = new_ids(json_of(mpi));
    ASSERT_EQ(got.size(), 1u) << mpi.out;
    greedy.insert(greedy.end(), got[0].begin(), got[0].end());
    EXPECT_EQ(greedy, want.greedy) << name;
  }
}

TEST(CliGenerate, ReadsPromptFilesAndConfigFiles) {
  ScratchDir scratch("sw_cli_generate_files");
  const fs::path& dir = scratch.path;
  fs::create_directories(dir);
  std::ofstream(dir / "prompts.txt") << "12+34=\n\n5+6=\n";
  std::ofstream(dir / "gen.toml") << "[generate]\nmax-new-tokens = 2\neos-id = -1\njson = true\n";
  Result r = run(generate("--prompt-file " + (dir / "prompts.txt").string() + " --config " + (dir / "gen.toml").string()));
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = json_of(r);
  ASSERT_EQ(j["sequences"].size(), 2u) << r.out;
  EXPECT_EQ(j["sequences"][1]["prompt"], "5+6=");
  EXPECT_EQ(j["sequences"][0]["new_ids"].size(), 2u);
}

TEST(CliGenerate, BadInputIsOneLineAndExitStatusTwo) {
  auto expect_usage_error = [](const std::string& args, const std::string& needle) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("shardwise: error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
  };
  expect_usage_error("generate --checkpoint /nonexistent/ckpt --prompt 1+1=", "'/nonexistent/ckpt' is not a directory");
  expect_usage_error("generate --prompt 1+1=", "give the model: --checkpoint DIR");
  expect_usage_error(generate(""), "no prompt");
  expect_usage_error(generate("--prompt 1+1=1+1=1+1="), "prompt 0 has 12 tokens; the model holds at most 9 positions");
  expect_usage_error(generate("--prompt-ids 1,2,300"), "token 300 at position 2 is outside the vocabulary [0, 128)");
  expect_usage_error(generate("--prompt-ids 1,x"), "'x' in prompt 0 is not a token id");
  expect_usage_error(generate("--prompt 1+1= --top-p 0"), "--top-p must be in (0, 1], got 0");
  expect_usage_error(generate("--prompt 1+1= --top-p 1.5"), "--top-p must be in (0, 1], got 1.5");
  expect_usage_error(generate("--prompt 1+1= --mesh pp=2"), "layers cannot fill 2 pipeline stages");  // a 1-layer model
  expect_usage_error(generate("--prompt 1+1= --mesh tp=3"), "4 heads do not divide over tp=3");
  expect_usage_error(generate("--prompt 1+1= --max-new-tokens 0"), "--max-new-tokens must be at least 1");
  expect_usage_error(generate("--prompt 1+1= --temprature 1"), "did you mean '--temperature'");
  expect_usage_error(generate("--prompt 1+1= --logits-out /nonexistent/dir/logits.safetensors"),
                     "--logits-out '/nonexistent/dir/logits.safetensors': the directory '/nonexistent/dir' does not "
                     "exist or is not writable");
}

}  // namespace
