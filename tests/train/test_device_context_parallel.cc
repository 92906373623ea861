// Context parallelism on the fake device (`train --device fake --mesh cp=...`): ring attention on
// device tensors (the fake table's ring_attention kernels, ops/attention/ring.h), its k, v, dk, dv
// blocks passed between the rank threads as device buffers, in cp's balanced order. GPT-2 and Llama
// tiny on cp=2, dp=2 x cp=2 and cp=2 x tp=2 threads, f32 and --bf16: the losses, gradient norms,
// masters and checkpoint files equal the same run's on the CPU bit for bit, and the ring adds no
// host copy (the host reads each micro-batch's loss and a step's sums of squares, and copies in each
// micro-batch's ids and labels, as without cp). A device whose kernel table has no ring kernel of
// its own (CUDA's) refuses a cp mesh, naming the kernel.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>

#include "shardwise/ckpt/commit.h"
#include "tests/support/device_curves.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

struct Case {
  std::string model, mesh;
  bool bf16 = false;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << c.mesh << (c.bf16 ? " bf16" : ""); }
};

constexpr int64_t kSteps = 3;

TrainConfig config_of(const Case& k) {
  TrainConfig c = k.model == "gpt2" ? small_config(k.mesh, kSteps) : llama_test_config(k.mesh, kSteps);
  c.model.seq = 16;  // 2 x cp chunks (cp's balanced order)
  c.bf16 = k.bf16;
  return c;
}

class DeviceContextParallel : public FakeDeviceTest, public testing::WithParamInterface<Case> {};

TEST_P(DeviceContextParallel, FakeDeviceEqualsTheCpuBitForBitCurveMastersAndCheckpoint) {
  TrainConfig c = config_of(GetParam());
  const int64_t ranks = mesh::parse_mesh(c.parallel.mesh).size();
  const CpuAndFake r = expect_fake_curve_is_the_cpus(c, kSteps, "cp");
  const Curve &cpu = r.cpu, &dev = r.dev;
  const int64_t micro = dev.accumulation;
  EXPECT_EQ(dev.copies.to_host_copies, kSteps * ranks * (micro + 1));
  EXPECT_EQ(dev.copies.to_device_copies, kSteps * ranks * micro * 2);
  ASSERT_FALSE(cpu.params.empty());
  for (const auto& [param, whole] : cpu.params) {  // the masters after the last update
    ASSERT_TRUE(dev.params.contains(param)) << param;
    EXPECT_EQ(std::memcmp(dev.params.at(param).raw(), whole.raw(), whole.nbytes()), 0) << param;
  }
  expect_same_files(ckpt::find_resume(r.dirs[0])->dir, ckpt::find_resume(r.dirs[1])->dir);
  for (const std::filesystem::path& d : r.dirs) std::filesystem::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Runs, DeviceContextParallel,
                         testing::Values(Case{"gpt2", "cp=2"}, Case{"llama", "cp=2"}, Case{"gpt2", "cp=2", true},
                                         Case{"llama", "cp=2", true}, Case{"gpt2", "dp=2,cp=2"},
                                         Case{"llama", "cp=2,tp=2", true}),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string mesh = info.param.mesh;
                           if (const size_t comma = mesh.find(','); comma != std::string::npos) mesh[comma] = '_';
                           std::erase(mesh, '=');
                           return info.param.model + "_" + mesh + (info.param.bf16 ? "_bf16" : "");
                         });

// A kernel table without ring_attention kernels of its own (CUDA's: its attention kernels take no
// block coordinates yet) cannot run a cp mesh: the check refuses it before anything is built,
// naming the kernel and the table; the fake table has them.
TEST_F(FakeDeviceTest, ACpMeshIsRefusedOnADeviceWithoutRingAttentionKernels) {
  TrainConfig c = config_of(Case{"gpt2", "cp=2"});
  c.device = kFake;
  EXPECT_NO_THROW(c.check(2, false));
  auto fake = ops::install_device_kernels(DeviceKind::Cuda, std::make_shared<ops::DeviceKernelTable>("cuda"));
  try {
    c.check(2, false);
    ADD_FAILURE() << "cp=2 on a table without ring kernels: no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device cuda:0 with a cp dim in --mesh [cp=2]"), std::string::npos) << what;
    EXPECT_NE(what.find("ring_attention kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("(cuda)"), std::string::npos) << what;
  }
  ops::install_device_kernels(DeviceKind::Cuda, fake);
}

}  // namespace
}  // namespace shardwise::train
