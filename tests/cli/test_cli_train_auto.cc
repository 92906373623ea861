// `shardwise train --auto`: with this machine's calibration the run takes the candidate `plan
// --auto` ranks first for its --ranks devices, trains on it, and its header names it; the options
// the search chooses cannot be given beside it, and without a calibration it says what to run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cluster_file.h"
#include "run_cli.h"

using namespace shardwise_cli_test;
using nlohmann::json;

namespace {

const std::string kJob = "--layers 2 --hidden 64 --heads 4 --global-batch 16";

// The text between `start` and the next `end` in `s` ("" when absent).
std::string between(const std::string& s, const std::string& start, const std::string& end) {
  const size_t a = s.find(start);
  if (a == std::string::npos) return "";
  const size_t b = s.find(end, a + start.size());
  return s.substr(a + start.size(), b == std::string::npos ? std::string::npos : b - a - start.size());
}

}  // namespace

TEST(CliTrainAuto, RunsPlanAutosBestAndTheHeaderNamesIt) {
  const auto cache = fresh_cache("train_auto");
  ASSERT_EQ(run_cached(cache, "calibrate --quick").status, 0);
  Result r = run_cached(cache, "train --auto --ranks 2 " + kJob + " --steps 2 --eval-every 0 --progress none --run-dir " +
                                   tmp("train_auto_run"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string options = between(r.out, "  auto: ", "\n");
  ASSERT_FALSE(options.empty()) << r.out;
  EXPECT_NE(options.find("plan --auto predicts on this machine (shardwise calibrate)"), std::string::npos) << options;
  // The candidate plan --auto ranks first for the same job on 2 devices of the same calibration.
  Result plan = run_cached(cache, "plan --auto --json --devices 2 " + kJob);
  ASSERT_EQ(plan.status, 0) << plan.out;
  const json best = json::parse(plan.out)["candidates"][0];
  EXPECT_NE(options.find("(" + best["train_options"].get<std::string>() + ")"), std::string::npos)
      << options << "\n" << best.dump();
  // The run is on the chosen mesh and batch split.
  EXPECT_NE(r.out.find("on mesh [" + best["mesh"].get<std::string>() + "] (2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("micro-batch " + std::to_string(best["micro_batch"].get<int>()) + " x accumulation " +
                       std::to_string(best["accumulation"].get<int>())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
}

TEST(CliTrainAuto, RefusesTheOptionsItChoosesAndAMissingCalibration) {
  const auto cache = fresh_cache("train_auto_refusals");
  Result r = run_cached(cache, "train --auto --ranks 2 " + kJob + " --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no calibration cached for this machine"), std::string::npos) << r.out;
  ASSERT_EQ(run_cached(cache, "calibrate --quick").status, 0);
  r = run_cached(cache, "train --auto --ranks 2 --mesh dp=2 --micro-batch 4 " + kJob + " --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("leave out --mesh, --micro-batch (or leave out --auto)"), std::string::npos) << r.out;
}
