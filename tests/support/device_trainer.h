#pragma once
// Trainer runs on the fake device (tensor/fake_device.h registered as cuda:0, its kernel table
// installed for CUDA) or the host, shared by the device trainer tests: rank 0's losses and gradient
// norms, the host-device copies of the steps alone, the masters after the last step, with a load
// (or an --init-from) before and a save after; checkpoint directories compared file by file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/on_fake_device.h"
#include "shardwise/train/checkpointing.h"

namespace shardwise::train {

inline const Device kFake = Device::cuda(0);

// Registers a fake device as cuda:0 and installs its kernel table for the test's duration.
class FakeDeviceTest : public testing::Test {
 protected:
  void SetUp() override {
    fake_ = &register_fake_device({.index = 0, .capacity = size_t{4} << 30});
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  }
  // No access on one stream to memory another stream used without an event or host wait between:
  // a race on a GPU (FakeDeviceMemory::stream_races).
  void TearDown() override {
    ops::install_device_kernels(DeviceKind::Cuda, previous_);
    expect_no_stream_races(*fake_);
  }
  FakeDeviceMemory* fake_ = nullptr;  // its stream log

 private:
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
};

struct Curve {
  std::vector<double> losses, norms;  // rank 0's
  DeviceCopyStats copies;             // during the steps, every rank
  // Every trained parameter's master, whole, after the last step (none on a pp mesh, whose ranks
  // hold their stages' parameters only: compare its checkpoint).
  std::map<std::string, Tensor> params;
  int64_t accumulation = 0;              // micro-batches per step (as the trainer resolved them)
  int64_t activation_bytes = 0;          // rank 0's peak of saved activations in the last step
  std::vector<HeldBytes> held;           // per world rank, what its Trainer holds after the last step
};

struct CurveIo {
  std::filesystem::path load, save;  // before the steps / after them (empty: none)
  std::filesystem::path init_from = {};  // init_from_model before the steps (a transformers directory; empty: none)
  bool async = false;                // the save through CheckpointSchedule's background saver
};

// `steps` steps of `c` (its mesh as threads, on c.device).
inline Curve run_curve(const TrainConfig& c, int64_t steps, const CurveIo& io = {}) {
  Curve out;
  std::mutex mu;
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  out.held.resize(static_cast<size_t>(ranks));
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    if (w.rank() == 0) out.accumulation = t.config().optimizer.accumulation;
    if (!io.init_from.empty()) init_from_model(t, *world, io.init_from);
    if (!io.load.empty()) load_trainer(t, *world, io.load);
    world->barrier();
    if (w.rank() == 0) reset_device_copy_stats();
    world->barrier();
    for (int64_t s = 0; s < steps; ++s) {
      const StepResult r = t.step();
      if (w.rank() == 0) out.losses.push_back(r.loss), out.norms.push_back(r.grad_norm);
    }
    world->barrier();
    if (w.rank() == 0) out.copies = device_copy_stats(), out.activation_bytes = t.held_bytes().activations;
    out.held[static_cast<size_t>(w.rank())] = t.held_bytes();
    world->barrier();
    if (!io.save.empty()) {
      CheckpointSchedule schedule(io.save, steps, io.async, {});
      schedule.after_step(t, *world, true);
      schedule.finish();
    }
    if (c.parallel.mesh.find("pp=") != std::string::npos) return;
    for (ParamState& p : t.params()) {
      Tensor whole = t.gather_param(p.name);
      std::lock_guard lock(mu);
      if (w.rank() == 0) out.params[p.name] = whole;
    }
  });
  return out;
}

// The device run's losses and gradient norms equal the CPU run's bit for bit, `steps` of them; the
// CPU run trains and copies nothing between host and device.
inline void expect_same_curve(const Curve& dev, const Curve& cpu, int64_t steps) {
  ASSERT_EQ(dev.losses.size(), static_cast<size_t>(steps));
  for (size_t s = 0; s < static_cast<size_t>(steps); ++s) {
    EXPECT_EQ(dev.losses[s], cpu.losses[s]) << "step " << s + 1;
    EXPECT_EQ(dev.norms[s], cpu.norms[s]) << "step " << s + 1;
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());  // it trains
  EXPECT_EQ(cpu.copies.to_host_copies + cpu.copies.to_device_copies, 0);
}

// An empty path under the test's scratch directory: "shardwise-device-<name>".
inline std::filesystem::path fresh_dir(const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() / ("shardwise-device-" + name);
  std::filesystem::remove_all(d);
  return d;
}

inline std::string bytes_of(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Every file under `a` has a twin under `b` with the same bytes, and no other file is in `b`.
inline void expect_same_files(const std::filesystem::path& a, const std::filesystem::path& b) {
  namespace fs = std::filesystem;
  int64_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(a)) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), a);
    ++files;
    ASSERT_TRUE(fs::exists(b / rel)) << rel;
    EXPECT_TRUE(bytes_of(e.path()) == bytes_of(b / rel)) << rel << " differs";
  }
  int64_t other = 0;
  for (const auto& e : fs::recursive_directory_iterator(b)) other += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(other, files);
  EXPECT_GT(files, 3);
}

}  // namespace shardwise::train
