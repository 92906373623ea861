// Checkpoints of a Trainer on the fake device (--device fake): saved from device memory (through
// host staging; --async-save copies before it returns and writes in the background) they are the
// files a CPU run saves, byte for byte; a checkpoint of either loads on the other and the loss
// curve continues bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "shardwise/ckpt/commit.h"
#include "tests/support/device_trainer.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

class DeviceResume : public FakeDeviceTest, public testing::WithParamInterface<std::string> {};

TEST_P(DeviceResume, SavedFromTheDeviceAsFromTheCpuAndLoadedOnEitherTheCurveGoesOn) {
  TrainConfig host = GetParam() == "llama_bf16" ? llama_test_config("tp=2", 5) : small_config("dp=2", 5);
  host.bf16 = GetParam() == "llama_bf16";
  TrainConfig dev = host;
  dev.device = kFake;
  const Curve whole = run_curve(host, 5);
  const std::string name = "resume-" + GetParam();
  const fs::path on_cpu = fresh_dir(name + "-cpu"), on_dev = fresh_dir(name + "-dev"), async = fresh_dir(name + "-async");
  run_curve(host, 3, {.load = {}, .save = on_cpu});
  const Curve first = run_curve(dev, 3, {.load = {}, .save = on_dev});
  run_curve(dev, 3, {.load = {}, .save = async, .async = true});
  const fs::path cpu_dir = ckpt::find_resume(on_cpu)->dir, dev_dir = ckpt::find_resume(on_dev)->dir;
  expect_same_files(cpu_dir, dev_dir);
  expect_same_files(cpu_dir, ckpt::find_resume(async)->dir);
  // Each one's checkpoint on the other, and on itself: the last two steps of the whole curve.
  for (const auto& [from, config] : {std::pair{dev_dir, host}, {cpu_dir, dev}, {dev_dir, dev}}) {
    const Curve rest = run_curve(config, 2, {.load = from, .save = {}});
    ASSERT_EQ(rest.losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(rest.losses[s], whole.losses[3 + s]) << from << " on " << config.device.to_string() << ", step " << 4 + s;
      EXPECT_EQ(rest.norms[s], whole.norms[3 + s]) << from << " on " << config.device.to_string() << ", step " << 4 + s;
    }
  }
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(first.losses[s], whole.losses[s]);
}

INSTANTIATE_TEST_SUITE_P(Runs, DeviceResume, testing::Values("gpt2_dp2", "llama_bf16"));

}  // namespace
}  // namespace shardwise::train
