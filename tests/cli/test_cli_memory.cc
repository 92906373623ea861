// `shardwise plan --memory`, `train --dry-run` and `train --memory-limit` (train/memory_plan.h): the
// plan's state bytes against the GPT-2 parameter formula, and the refusal of a run that does not fit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "run_cli.h"

namespace {

using shardwise_cli_test::gpt2_parameters;
using shardwise_cli_test::lines;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

const std::string kRun = "--layers 1 --hidden 32 --heads 4 --seq 16 --vocab 128 --global-batch 16 --eval-every 0";

TEST(CliMemory, PlanMemoryPrintsEveryRanksBytesAsATableAndJson) {
  Result table = run("plan --memory --mesh dp=2 " + kRun);
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("memory plan: GPT 1 layer, hidden 32"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("activations"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("per process (threads"), std::string::npos) << table.out;

  const int64_t n = gpt2_parameters(1, 32, 16, 128);
  for (int stage : {0, 1}) {
    Result r = run("plan --memory --json --memory-limit none --mesh dp=2 --sharding-stage " + std::to_string(stage) +
                   " --sharding-layout v2 " + kRun);
    ASSERT_EQ(r.status, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["ranks"].size(), 2u);
    int64_t peaks = 0;
    for (const auto& rank : j["ranks"]) {
      EXPECT_EQ(rank["params"].get<int64_t>(), 4 * n);  // each dp rank holds the whole f32 model
      EXPECT_EQ(rank["grads"].get<int64_t>(), 4 * n);
      // AdamW's two f32 moments: whole, or half the flat buffer each (v2: equal ranges, n even).
      EXPECT_EQ(rank["optimizer"].get<int64_t>(), stage == 0 ? 8 * n : 4 * n);
      EXPECT_EQ(rank["masters"].get<int64_t>(), 0);
      EXPECT_GT(rank["activations"].get<int64_t>(), 0);
      peaks += rank["peak"].get<int64_t>();
    }
    EXPECT_EQ(j["per_process"].get<int64_t>(), peaks);  // threads: both ranks in one process
  }
  // The same options from a config file.
  const std::string cfg = ::testing::TempDir() + "/memory.toml";
  { std::ofstream(cfg) << "mesh = \"dp=2\"\nbf16 = true\n"; }
  Result bf16 = run("plan --memory --json --config " + cfg + " " + kRun);
  ASSERT_EQ(bf16.status, 0) << bf16.out;
  const nlohmann::json j = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(j["ranks"][0]["params"].get<int64_t>(), 2 * n);
  EXPECT_EQ(j["ranks"][0]["masters"].get<int64_t>(), 4 * n);
}

TEST(CliMemory, ARunOverTheMemoryLimitIsRefusedBeforeTrainingWithWhatWouldFit) {
  Result r = run("train --mesh dp=2 --memory-limit 100KiB " + kRun);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
  for (const char* part : {"shardwise: error: the run's estimated peak memory is", "over --memory-limit 100KiB",
                           "--sharding-stage 2 (", "--sharding-stage 3 (", "--sharding-stage 3 --recompute full (",
                           "--recompute full (", "shardwise plan --memory"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  // --dry-run prints the plan and stops; over the limit it says so and fails alike.
  Result dry = run("train --dry-run --mesh dp=2 --memory-limit 100GiB " + kRun);
  ASSERT_EQ(dry.status, 0) << dry.out;
  EXPECT_NE(dry.out.find("memory plan:"), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("--memory-limit 100GiB (107374182400 bytes): fits"), std::string::npos) << dry.out;
  EXPECT_EQ(dry.out.find("done:"), std::string::npos) << dry.out;
  Result over = run("train --dry-run --mesh dp=2 --memory-limit 100KiB " + kRun);
  EXPECT_EQ(over.status, 2) << over.out;
  EXPECT_NE(over.out.find("does not fit"), std::string::npos) << over.out;
  Result json = run("train --json --mesh dp=2 " + kRun);
  EXPECT_EQ(json.status, 2) << json.out;
  EXPECT_NE(json.out.find("--json prints the memory plan of --dry-run"), std::string::npos) << json.out;
  Result bad = run("train --mesh dp=2 --memory-limit lots " + kRun);
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--memory-limit 'lots': use auto"), std::string::npos) << bad.out;
}

}  // namespace

// `plan --memory --kept N`: what one micro-batch's frame keeps for its backward, tensor by tensor.
// With one micro-batch on one stage the kept tensors are the frame: their bytes sum to the plan's
// activations (an independent count: the runtime-replayed peak). A Llama with sequence parallelism
// under bf16 compute keeps SwiGLU's gate and up for its gradient and no gathered matmul input.
TEST(CliMemory, KeptListsTheTensorsAFrameKeepsAndWhoReadsThem) {
  const std::string llama = "--model llama --layers 1 --hidden 64 --heads 4 --kv-heads 2 --seq 32 --vocab 128 "
                            "--global-batch 2 --micro-batch 1 --accumulation 1 --mesh dp=2,tp=2 --sp --bf16 --compute bf16 "
                            "--memory-limit none";
  Result r = run("plan --memory --json --kept 3 " + llama);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const auto& rank : j["ranks"]) {
    int64_t sum = 0;
    bool gate = false;
    for (const auto& k : rank["kept"]) {
      sum += k["bytes"].get<int64_t>();
      const std::string name = k["name"];
      EXPECT_EQ(name.find(".gathered"), std::string::npos) << name;
      if (name != "model.layers.0.mlp.gate_proj.out") continue;
      gate = true;
      EXPECT_EQ(k["read_by"], "swiglu backward");
    }
    EXPECT_TRUE(gate) << rank.dump();
    EXPECT_EQ(sum, rank["activations"].get<int64_t>()) << rank.dump();
  }
  const std::vector<std::pair<std::string, std::string>> shown = {
      {"plan --memory --kept 3 ", "rank 0 stage 0: a micro-batch keeps"},
      {"plan --memory --kept 3 ", "<- swiglu backward"},
      {"plan --memory --kept 3 ", "  the other "},
      {"plan --kept 3 ", "--kept goes with --memory"}};
  for (const auto& [command, text] : shown) {
    Result out = run(command + llama);
    EXPECT_EQ(out.status != 0, command.find("--memory") == std::string::npos) << out.out;
    EXPECT_NE(out.out.find(text), std::string::npos) << text << "\n" << out.out;
  }
}
