// `train --compute`: bf16 reaches the model builders (a run trains, its losses rounded away from the
// f32 run's but close to them), with --bf16 parameters too; another dtype is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

const std::string kSmall = "train --layers 1 --hidden 32 --heads 2 --global-batch 8 --eval-every 0 --steps 4 ";

std::vector<double> losses_of(const std::string& options, const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sw_cli_compute_" + name);
  fs::remove_all(d);
  Result r = run(kSmall + options + " --run-dir " + d.string());
  EXPECT_EQ(r.status, 0) << r.out;
  std::vector<double> out;
  for (const std::string& l : shardwise_cli_test::metrics_losses(d / "metrics.jsonl")) out.push_back(std::stod(l));
  return out;
}

TEST(CliCompute, Bf16ComputeTrainsNearTheF32Run) {
  const std::vector<double> f32 = losses_of("", "f32"), bf16 = losses_of("--compute bf16", "bf16"),
                            both = losses_of("--bf16 --compute bf16", "both");
  ASSERT_EQ(f32.size(), 4u);
  ASSERT_EQ(bf16.size(), 4u);
  ASSERT_EQ(both.size(), 4u);
  EXPECT_NE(bf16, f32) << "--compute bf16 rounds the GEMMs' operands";
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_NEAR(bf16[i], f32[i], 0.02 * f32[i]) << "step " << i + 1;
    EXPECT_NEAR(both[i], f32[i], 0.02 * f32[i]) << "step " << i + 1;
  }
}

TEST(CliCompute, AnotherDtypeIsRefusedNamingTheChoices) {
  Result r = run(kSmall + "--compute f16");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--compute"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bf16"), std::string::npos) << r.out;
}

}  // namespace
