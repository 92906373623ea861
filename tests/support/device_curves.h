#pragma once
// A configuration's run on the CPU against the same run on the fake device (device_trainer.h),
// each saving its last step, shared by the device tests that compare curves and checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/support/device_trainer.h"

namespace shardwise::train {

struct CpuAndFake {
  Curve cpu, dev;
  std::filesystem::path dirs[2];  // the CPU's save, the device's
};

// `c` run `steps` steps on the CPU and on the fake device, each saving its last step in a fresh
// directory named after the running test and `tag`: the same losses and gradient norms at every
// step, the CPU run trains, and the CPU run copies nothing between host and device.
inline CpuAndFake expect_fake_curve_is_the_cpus(TrainConfig c, int64_t steps, const std::string& tag) {
  std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '-');
  CpuAndFake r{{}, {}, {fresh_dir(tag + "-" + name + "-cpu"), fresh_dir(tag + "-" + name + "-dev")}};
  r.cpu = run_curve(c, steps, {.load = {}, .save = r.dirs[0]});
  c.device = kFake;
  r.dev = run_curve(c, steps, {.load = {}, .save = r.dirs[1]});
  expect_same_curve(r.dev, r.cpu, steps);
  return r;
}

}  // namespace shardwise::train
