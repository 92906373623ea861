// Whole training programs on the fake device (tensor/fake_device.h, ops/fake_device_kernels.h):
// GPT-2 and Llama tiny with parameters, inputs and every activation and gradient in fake-device
// memory (PROT_NONE outside its copies and kernel windows), for a few steps of plain SGD written
// with ops, give the CPU run's losses and gradient norms bit for bit, and the only device-to-host
// copies per step are the two values the host needs: the loss and the gradient norm. On dp=2 and
// tp=2 (threads) too, with the ordering rules of streams checked from the fake device's log; and
// the --compute bf16 programs (bf16 GEMM, attention, head and expert operands), bit for bit too.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/device_steps.h"
#include "tests/support/stream_races.h"

namespace shardwise::train {
namespace {

const Device kFake = Device::cuda(0);

struct Case {
  std::string model, mesh;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << c.mesh; }
};

class DeviceProgram : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    fake_ = &register_fake_device({.index = 0});
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  }
  void TearDown() override {
    ops::install_device_kernels(DeviceKind::Cuda, previous_);
    expect_no_stream_races(*fake_);
  }
  FakeDeviceMemory* fake_ = nullptr;
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
};

TEST_P(DeviceProgram, FakeDeviceStepsEqualTheCpuBitForBitReadingTwoValuesPerStep) {
  const GptConfig model = model_of(GetParam().model);
  const std::string& mesh = GetParam().mesh;
  const int64_t ranks = mesh::parse_mesh(mesh).size();
  reset_device_copy_stats();
  const StepsRun cpu = run_steps(model, mesh, Device::host());
  EXPECT_EQ(cpu.copies.to_host_copies + cpu.copies.to_device_copies, 0);
  reset_device_copy_stats();
  fake_->clear_stream_log();
  const StepsRun dev = run_steps(model, mesh, kFake);
  ASSERT_EQ(dev.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(dev.all_on_device);
  for (int s = 0; s < kSteps; ++s) {
    // Bit for bit: the same kernels on the same numbers, only the memory differs.
    EXPECT_EQ(dev.losses[s], cpu.losses[s]) << "step " << s;
    EXPECT_EQ(dev.norms[s], cpu.norms[s]) << "step " << s;
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());  // the steps train
  // The host reads the loss and the gradient norm, nothing else; it writes the parameters and the
  // constants once, and each step's ids and labels.
  EXPECT_EQ(dev.copies.to_host_copies, kSteps * 2 * ranks);
  EXPECT_EQ(dev.copies.to_host_bytes, kSteps * 2 * ranks * 4);
  EXPECT_EQ(dev.copies.to_device_copies, ranks * (dev.params + dev.constants + 2 * kSteps));

  // The streams: every kernel on a compute stream; each reshard on a communication stream after an
  // event of the compute stream, and the compute stream after an event of the communication stream;
  // the collectives' steps: a communication stream after its peers' communication streams; the host
  // waits only for its copies, and only on compute streams. No reshard opens device memory for the
  // host (its boxes and collectives move with device copies and reductions): no host window is
  // opened on a communication stream.
  std::map<uint64_t, void*> recorded_on;
  int64_t launches = 0, comm_waits = 0, peer_waits = 0, compute_waits = 0, syncs = 0, host_opens = 0;
  using K = FakeDeviceMemory::StreamEvent::Kind;
  for (const FakeDeviceMemory::StreamEvent& e : fake_->stream_log()) {
    switch (e.kind) {
      case K::Launch:
        ++launches;
        EXPECT_TRUE(dev.compute.contains(e.stream)) << "a kernel on stream " << e.stream;
        break;
      case K::Record: recorded_on[e.event] = e.stream; break;
      case K::Wait:
        ASSERT_TRUE(recorded_on.contains(e.event));
        if (dev.comm.contains(e.stream) && dev.comm.contains(recorded_on[e.event])) {
          ++peer_waits;
          EXPECT_NE(recorded_on[e.event], e.stream) << "a stream waits for its peers, not itself";
        } else if (dev.comm.contains(e.stream)) {
          ++comm_waits;
          EXPECT_TRUE(dev.compute.contains(recorded_on[e.event]));
        } else {
          ++compute_waits;
          EXPECT_TRUE(dev.compute.contains(e.stream));
          EXPECT_TRUE(dev.comm.contains(recorded_on[e.event]));
        }
        break;
      case K::Synchronize:
        ++syncs;
        EXPECT_TRUE(dev.compute.contains(e.stream) || e.stream == nullptr) << "a host wait on stream " << e.stream;
        break;
      case K::HostOpen:
        ++host_opens;
        EXPECT_FALSE(dev.comm.contains(e.stream)) << "a reshard opened device memory for the host";
        break;
      default: break;
    }
  }
  EXPECT_GT(launches, 0);
  EXPECT_GT(host_opens, 0);
  EXPECT_EQ(comm_waits, dev.reshards);
  EXPECT_EQ(compute_waits, dev.reshards);
  if (ranks > 1) {
    EXPECT_GT(dev.reshards, 0);
    EXPECT_GT(peer_waits, 0);
  }
  EXPECT_EQ(syncs, dev.copies.to_host_copies + dev.copies.to_device_copies);
  EXPECT_EQ(dev.compute.size(), static_cast<size_t>(ranks));
  EXPECT_EQ(dev.comm.size(), static_cast<size_t>(ranks));
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceProgram,
                         testing::Values(Case{"gpt2", "dp=1"}, Case{"llama", "dp=1"}, Case{"gpt2", "dp=2"},
                                         Case{"gpt2", "tp=2"}, Case{"llama", "tp=2"}, Case{"gpt2_bf16", "dp=1"},
                                         Case{"llama_bf16", "dp=1"}, Case{"gpt2_bf16", "tp=2"},
                                         Case{"llama_bf16", "dp=2"}, Case{"mixtral_bf16", "dp=1"}),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string mesh = info.param.mesh;
                           mesh.erase(mesh.find('='), 1);
                           return info.param.model + "_" + mesh;
                         });

}  // namespace
}  // namespace shardwise::train
