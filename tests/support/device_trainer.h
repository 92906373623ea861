#pragma once
// Trainer runs on the fake device (tensor/fake_device.h registered as cuda:0, its kernel table
// installed for CUDA) or the host, shared by the device trainer tests: rank 0's losses and gradient
// norms, the host-device copies of the steps alone, the masters after the last step, with a load
// before and a save after.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "shardwise/train/checkpointing.h"

namespace shardwise::train {

inline const Device kFake = Device::cuda(0);

// Registers a fake device as cuda:0 and installs its kernel table for the test's duration.
class FakeDeviceTest : public testing::Test {
 protected:
  void SetUp() override {
    register_fake_device({.index = 0, .capacity = size_t{4} << 30});
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  }
  void TearDown() override { ops::install_device_kernels(DeviceKind::Cuda, previous_); }

 private:
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
};

struct Curve {
  std::vector<double> losses, norms;  // rank 0's
  DeviceCopyStats copies;             // during the steps, every rank
  std::map<std::string, Tensor> params;  // every trained parameter's master, whole, after the last step
  int64_t accumulation = 0;              // micro-batches per step (as the trainer resolved them)
};

struct CurveIo {
  std::filesystem::path load, save;  // before the steps / after them (empty: none)
  bool async = false;                // the save through CheckpointSchedule's background saver
};

// `steps` steps of `c` (its mesh as threads, on c.device).
inline Curve run_curve(const TrainConfig& c, int64_t steps, const CurveIo& io = {}) {
  Curve out;
  std::mutex mu;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    if (w.rank() == 0) out.accumulation = t.config().optimizer.accumulation;
    if (!io.load.empty()) load_trainer(t, *world, io.load);
    world->barrier();
    if (w.rank() == 0) reset_device_copy_stats();
    world->barrier();
    for (int64_t s = 0; s < steps; ++s) {
      const StepResult r = t.step();
      if (w.rank() == 0) out.losses.push_back(r.loss), out.norms.push_back(r.grad_norm);
    }
    world->barrier();
    if (w.rank() == 0) out.copies = device_copy_stats();
    world->barrier();
    if (!io.save.empty()) {
      CheckpointSchedule schedule(io.save, steps, io.async, {});
      schedule.after_step(t, *world, true);
      schedule.finish();
    }
    for (ParamState& p : t.params()) {
      Tensor whole = t.gather_param(p.name);
      std::lock_guard lock(mu);
      if (w.rank() == 0) out.params[p.name] = whole;
    }
  });
  return out;
}

}  // namespace shardwise::train
