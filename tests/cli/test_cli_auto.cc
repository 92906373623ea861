// `shardwise plan --auto`: on a 4-device cluster every shown candidate is a run train accepts whose
// own `plan --predict` gives the same step, the list is fastest first, the memory rule removes exactly
// the candidates over the limit, and the A100 preset's 3,072 devices are searched (the analytic model)
// with more than 1,000 candidates predicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster_file.h"
#include "run_cli.h"

using namespace shardwise_cli_test;
using nlohmann::json;

namespace {

json search(const std::string& args) { return run_json("plan --auto --json " + kPlanModel + " " + args); }

// Four devices on a node with links and memory of plain numbers; `memory_bytes` each.
std::string four_devices(double memory_bytes) {
  ToyCluster t;
  t.name = "four", t.memory_bytes = memory_bytes;
  return write_cluster(t, std::to_string(static_cast<int64_t>(memory_bytes)));
}

}  // namespace

TEST(CliAuto, CandidatesAreRunsTrainAcceptsPredictedAsPlanPredictDoes) {
  const std::string cluster = four_devices(1e12);
  json j = search("--cluster " + cluster + " --top 1000");
  EXPECT_EQ(j["model"], "programs");
  EXPECT_EQ(j["devices"], 4);
  EXPECT_EQ(j["over_memory"], 0);
  EXPECT_EQ(j["refused_by_checks"], 0);  // the rules keep only what train accepts
  ASSERT_EQ(j["candidates"].size(), j["predicted"].get<size_t>());
  EXPECT_GT(j["predicted"].get<int>(), 20);
  double previous = 0;
  for (const json& c : j["candidates"]) {
    EXPECT_GE(c["step_time_s"].get<double>(), previous) << c.dump();
    previous = c["step_time_s"].get<double>();
  }
  // The best, a pipeline and a sequence-parallel candidate, as `plan --predict` of their train
  // options predicts them.
  std::vector<json> checked = {j["candidates"][0]};
  for (const json& c : j["candidates"])
    if (c["mesh"].get<std::string>().starts_with("pp=2") && checked.size() < 2) checked.push_back(c);
  for (const json& c : j["candidates"])
    if (c["sequence_parallel"].get<bool>() && checked.size() < 3) checked.push_back(c);
  ASSERT_EQ(checked.size(), 3u);
  for (const json& c : checked) {
    Result r = run("plan --predict --json " + kPlanModel + " --cluster " + cluster + " " + c["train_options"].get<std::string>());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_DOUBLE_EQ(json::parse(r.out)["step_time_s"].get<double>(), c["step_time_s"].get<double>()) << c.dump();
  }
}

TEST(CliAuto, TheMemoryRuleRemovesExactlyTheCandidatesOverTheLimit) {
  json all = search("--cluster " + four_devices(1e12) + " --top 1000 --memory-margin 0");
  std::vector<int64_t> peaks;
  for (const json& c : all["candidates"]) peaks.push_back(c["memory_bytes"].get<int64_t>());
  std::sort(peaks.begin(), peaks.end());
  const int64_t limit = peaks[peaks.size() / 2];  // half the candidates are over it
  const size_t over = static_cast<size_t>(peaks.end() - std::upper_bound(peaks.begin(), peaks.end(), limit));
  ASSERT_GT(over, 0u);
  json kept = search("--cluster " + four_devices(static_cast<double>(limit)) + " --top 1000 --memory-margin 0");
  EXPECT_EQ(kept["over_memory"].get<size_t>(), over);
  EXPECT_EQ(kept["predicted"].get<size_t>(), peaks.size() - over);
  for (const json& c : kept["candidates"]) EXPECT_LE(c["memory_bytes"].get<int64_t>(), limit) << c.dump();
  // A margin keeps that share of the device free: half of twice the limit removes the same.
  json margin = search("--cluster " + four_devices(2 * static_cast<double>(limit)) + " --top 1000 --memory-margin 0.5");
  EXPECT_EQ(margin["over_memory"].get<size_t>(), over);
}

TEST(CliAuto, SearchesTheA100PresetsThreeThousandDevicesAnalytically) {
  const std::string preset = std::string(SHARDWISE_SOURCE_DIR) + "/examples/clusters/a100-80gb-dgx.json";
  json j = json::parse(run("plan --auto --json --cluster " + preset +
                           " --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 --global-batch 1536 --bf16")
                           .out);
  EXPECT_EQ(j["devices"], 3072);
  EXPECT_EQ(j["model"], "analytic");
  EXPECT_GE(j["predicted"].get<int>(), 1000);
  EXPECT_GT(j["over_memory"].get<int>(), 0);  // a 175B-class model does not fit everywhere
  for (const json& c : j["candidates"]) EXPECT_LE(c["memory_bytes"].get<double>(), 0.9 * 80 * 1024.0 * 1024 * 1024);
}

TEST(CliAuto, AnalyticSearchesWithTheAnalyticModelAndPredictsAsPredictAnalyticDoes) {
  const std::string cluster = four_devices(1e12);
  json j = search("--cluster " + cluster + " --analytic --top 1");
  EXPECT_EQ(j["model"], "analytic");
  const json best = j["candidates"][0];
  json p = run_json("plan --predict --analytic --json " + kPlanModel + " --cluster " + cluster + " " +
                    best["train_options"].get<std::string>());
  EXPECT_DOUBLE_EQ(p["step_time_s"].get<double>(), best["step_time_s"].get<double>()) << best.dump();
}

TEST(CliAuto, TextNamesTheCountsAndTheBestsTrainOptions) {
  Result r = run("plan --auto " + kPlanModel + " --cluster " + four_devices(1e12) + " --top 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("plan --auto on four (4 devices, 4 a node), global batch 8 x seq 32: 3840 combinations searched"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(compiled programs); removed: pp-layers "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n 2. "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\n 3. "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train options of the best: --mesh "), std::string::npos) << r.out;
}

TEST(CliAuto, BadOptionsAreRefusedByName) {
  Result r = run("plan --auto " + kPlanModel + " --cluster " + four_devices(1e12) + " --devices 8");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--devices 8 is more than cluster 'four' has (4)"), std::string::npos) << r.out;
  r = run("plan --auto " + kPlanModel + " --cluster " + four_devices(1e12) + " --memory-margin 1");
  EXPECT_NE(r.out.find("--memory-margin must be in [0, 1)"), std::string::npos) << r.out;
  r = run("plan --auto " + kPlanModel + " --cluster " + four_devices(1e3));
  EXPECT_NE(r.out.find("no candidate fits"), std::string::npos) << r.out;
  r = run("plan " + kPlanModel + " --devices 4");
  EXPECT_NE(r.out.find("--devices and --max-micro-batch go with --auto"), std::string::npos) << r.out;
}
