// `shardwise train` with a diverging run: it stops at the first non-finite step with a non-zero exit,
// the step and the likely cause, and the last checkpoint before it stays the verified resume point.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "run_cli.h"

namespace {

using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

const std::string kDiverging = "train --mesh dp=1 --layers 1 --hidden 32 --digits 2 --global-batch 8 --steps 40 "
                               "--lr 1e6 --min-lr 0 --warmup 0 --clip 0 --log-every 1 ";

TEST(CliNonFinite, ANonFiniteLossStopsTheRunWithExitStatus2AndKeepsTheLastCheckpoint) {
  const std::string dir = tmp("shardwise-cli-nonfinite");
  std::filesystem::remove_all(dir);
  Result r = run(kDiverging + "--save-every 1 --run-dir " + dir);
  EXPECT_EQ(r.status, 2) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("shardwise: error: .*step ([0-9]+): the loss is not finite")))
      << r.out;
  const int failing = std::stoi(m[1]);
  EXPECT_NE(r.out.find("no gradient clipping (--clip 0)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  // The newest checkpoint verifies and its step is before the failing one.
  int newest = -1;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0 && name.find('.') == std::string::npos) {
      newest = std::max(newest, std::stoi(name.substr(11)));
    }
  }
  ASSERT_GE(newest, 1) << r.out;
  EXPECT_EQ(newest, failing - 1) << r.out;
  Result v = run("ckpt verify " + dir + "/checkpoints/checkpoint-" + std::to_string(newest));
  EXPECT_EQ(v.status, 0) << v.out;
}

TEST(CliNonFinite, SkippingIsAnExplicitOptIn) {
  Result r = run(kDiverging + "--skip-nonfinite-steps --run-dir " + tmp("shardwise-cli-nonfinite-skip"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 40 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("non-finite loss or gradient norm (--skip-nonfinite-steps)"), std::string::npos) << r.out;
}

}  // namespace
