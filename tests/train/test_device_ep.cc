// Expert parallelism on the fake device (`train --device fake --mesh ep=...`): Mixtral tiny (Llama
// tiny with 4 experts, top 2, in every layer) whose MoE kernel moves the tokens' rows between the
// ep ranks by all_to_all_v on device buffers and all-gathers the router's counts on device memory
// (ops/fake_device_moe.h). On ep=2, dp=2 x ep=2 and tp=2 x ep=2 threads, f32 and --bf16
// --compute bf16: the losses, gradient norms, masters and checkpoint files equal the same run's on
// the CPU bit for bit.
//
// The host's copies a step, per rank and micro-batch: the loss and each MoE layer's four router
// statistics (as without ep), and each MoE call's gathered counts (forward and backward: two a
// layer) where the tokens are split over ranks; one vector of sums of squares a rank and step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <string>

#include "shardwise/ckpt/commit.h"
#include "tests/support/device_trainer.h"
#include "tests/support/llama_config.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string mesh;
  bool bf16 = false;  // --bf16 --compute bf16
  friend void PrintTo(const Case& c, std::ostream* os) { *os << "mixtral on " << c.mesh << (c.bf16 ? " bf16" : ""); }
};

constexpr int64_t kSteps = 3;

TrainConfig config_of(const Case& k) {
  TrainConfig c = llama_test_config(k.mesh, kSteps);
  c.model.experts = 4, c.model.top_k = 2;
  c.bf16 = k.bf16;
  if (k.bf16) c.model.compute_dtype = DType::BF16;
  return c;
}

class DeviceExpertParallel : public FakeDeviceTest, public testing::WithParamInterface<Case> {};

TEST_P(DeviceExpertParallel, FakeDeviceEqualsTheCpuBitForBitReadingTheCountsOnce) {
  TrainConfig c = config_of(GetParam());
  const int64_t ranks = mesh::parse_mesh(c.parallel.mesh).size();
  std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '-');
  const fs::path on_cpu = fresh_dir("ep-" + name + "-cpu"), on_dev = fresh_dir("ep-" + name + "-dev");
  const Curve cpu = run_curve(c, kSteps, {.load = {}, .save = on_cpu});
  c.device = kFake;
  const Curve dev = run_curve(c, kSteps, {.load = {}, .save = on_dev});
  expect_same_curve(dev, cpu, kSteps);
  const int64_t micro = dev.accumulation, layers = c.model.layers;
  EXPECT_EQ(dev.copies.to_host_copies, kSteps * ranks * (micro * (1 + 4 * layers + 2 * layers) + 1));
  EXPECT_EQ(dev.copies.to_device_copies, kSteps * ranks * micro * 2);
  ASSERT_FALSE(cpu.params.empty());
  for (const auto& [param, whole] : cpu.params) {  // the masters after the last update
    ASSERT_TRUE(dev.params.contains(param)) << param;
    EXPECT_EQ(std::memcmp(dev.params.at(param).raw(), whole.raw(), whole.nbytes()), 0) << param;
  }
  expect_same_files(ckpt::find_resume(on_cpu)->dir, ckpt::find_resume(on_dev)->dir);
  fs::remove_all(on_cpu);
  fs::remove_all(on_dev);
}

INSTANTIATE_TEST_SUITE_P(Runs, DeviceExpertParallel,
                         testing::Values(Case{"ep=2"}, Case{"ep=2", true}, Case{"dp=2,ep=2"}, Case{"tp=2,ep=2"},
                                         Case{"dp=2,ep=2", true}),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string mesh = info.param.mesh;
                           std::replace(mesh.begin(), mesh.end(), ',', '_');
                           std::erase(mesh, '=');
                           return mesh + (info.param.bf16 ? "_bf16" : "");
                         });

}  // namespace
}  // namespace shardwise::train
