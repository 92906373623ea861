// The Trainer on the fake device (TrainConfig::device, `train --device fake`): parameters, AdamW's
// moments and masters, every step's tensors in fake-device memory (PROT_NONE outside its copies and
// kernel windows), the optimizer through the device's kernel table. Its losses and gradient norms
// equal the CPU's bit for bit on 1 rank, dp=2 and tp=2 (sp) threads, GPT-2, Llama and Mixtral, f32
// and --bf16; the host reads the loss (one copy a micro-batch, with MoE the router's statistics and,
// tokens split over ranks, each MoE call's gathered counts) and the gradients' sums of squares (one
// copy a step) and nothing else; each micro-batch's ids and
// labels are the only copies to the device.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "shardwise/runtime/profiler.h"
#include "tests/support/device_trainer.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

struct Case {
  std::string model, mesh;
  bool bf16 = false;
  std::string overlap = "off";  // --overlap-grad-reduce: the dp reduce by gradient buckets on the device
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.model << " on " << c.mesh << (c.bf16 ? " bf16" : "") << " overlap " << c.overlap;
  }
};

// gpt2, llama, or mixtral (Llama with 4 experts, top 2); a mesh with ",sp": sequence parallelism.
TrainConfig config_of(const Case& k) {
  std::string mesh = k.mesh;
  const bool sp = mesh.ends_with(",sp");
  if (sp) mesh.resize(mesh.size() - 3);
  TrainConfig c = k.model == "gpt2" ? small_config(mesh, 5) : llama_test_config(mesh, 5);
  if (k.model == "mixtral") c.model.experts = 4, c.model.top_k = 2;
  c.parallel.sequence_parallel = sp;
  c.parallel.overlap_grad_reduce = k.overlap;
  c.parallel.grad_bucket_mb = 0.01;  // several buckets
  c.bf16 = k.bf16;
  return c;
}

class DeviceTrainer : public FakeDeviceTest, public testing::WithParamInterface<Case> {};

TEST_P(DeviceTrainer, FakeDeviceEqualsTheCpuBitForBitReadingTheLossAndTheNormOnly) {
  TrainConfig c = config_of(GetParam());
  const int64_t ranks = mesh::parse_mesh(c.parallel.mesh).size();
  const Curve cpu = run_curve(c, 5);
  c.device = kFake;
  const Curve dev = run_curve(c, 5);
  ASSERT_EQ(dev.losses.size(), 5u);
  for (size_t s = 0; s < 5; ++s) {
    EXPECT_EQ(dev.losses[s], cpu.losses[s]) << "step " << s + 1;
    EXPECT_EQ(dev.norms[s], cpu.norms[s]) << "step " << s + 1;
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());  // it trains
  EXPECT_EQ(cpu.copies.to_host_copies + cpu.copies.to_device_copies, 0);
  // Per step and rank: the loss of each micro-batch (and an MoE layer's four router statistics, and
  // on dp=2 the counts its forward and backward all-gather over the token ranks on the device) and
  // one vector of sums of squares to the host; each micro-batch's ids and labels to the device.
  const int64_t micro = dev.accumulation;
  const int64_t stats = c.model.experts > 0 ? (ranks > 1 ? 6 : 4) * c.model.layers : 0;
  EXPECT_EQ(dev.copies.to_host_copies, 5 * ranks * (micro * (1 + stats) + 1));
  EXPECT_EQ(dev.copies.to_device_copies, 5 * ranks * micro * 2);
  for (const auto& [name, whole] : cpu.params) {  // the masters after the last update
    ASSERT_TRUE(dev.params.contains(name)) << name;
    EXPECT_EQ(std::memcmp(dev.params.at(name).raw(), whole.raw(), whole.nbytes()), 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, DeviceTrainer,
                         testing::Values(Case{"gpt2", "dp=1"}, Case{"llama", "dp=1"}, Case{"gpt2", "dp=2"},
                                         Case{"llama", "dp=2"}, Case{"gpt2", "tp=2"}, Case{"llama", "tp=2"},
                                         Case{"gpt2", "dp=1", true}, Case{"llama", "tp=2", true},
                                         Case{"mixtral", "dp=2"}, Case{"gpt2", "tp=2,sp"},
                                         Case{"gpt2", "dp=2", false, "on"}, Case{"llama", "dp=2,tp=2", true, "after"}),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string mesh = info.param.mesh;
                           if (const size_t comma = mesh.find(','); comma != std::string::npos) mesh[comma] = '_';
                           std::erase(mesh, '=');
                           return info.param.model + "_" + mesh + (info.param.bf16 ? "_bf16" : "") +
                                  (info.param.overlap == "off" ? "" : "_overlap_" + info.param.overlap);
                         });

// --profile on a device: the launches return before their work is done, so after each instruction
// the host waits for the rank's streams and the instruction's time is its work's. Without a profile
// the host waits only where it reads a value (the loss, the norm).
TEST_F(FakeDeviceTest, ProfilingOnADeviceWaitsForEachInstructionsWork) {
  TrainConfig c = small_config("dp=1", 1);
  c.device = kFake;
  using K = FakeDeviceMemory::StreamEvent::Kind;
  auto waited_share = [&](bool profiled) {  // of the launches, those the host waits for before the next
    fake_->clear_stream_log();
    comm::LocalWorld::run(1, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      runtime::RankProfile profile(w.rank());
      profile.start(w);
      runtime::ActiveProfile active(profiled ? &profile : nullptr);
      t.step();
    });
    const std::vector<FakeDeviceMemory::StreamEvent> log = fake_->stream_log();
    int64_t launches = 0, waited = 0;
    for (size_t i = 0; i < log.size(); ++i) {
      if (log[i].kind != K::Launch) continue;
      ++launches;
      for (size_t j = i + 1; j < log.size() && log[j].kind != K::Launch; ++j) {
        if (log[j].kind == K::Synchronize && log[j].stream == log[i].stream) {
          ++waited;
          break;
        }
      }
    }
    EXPECT_GT(launches, 50);
    return static_cast<double>(waited) / static_cast<double>(launches);
  };
  // (The optimizer's kernels run outside the program's instructions, unwaited: about a third here.)
  EXPECT_GT(waited_share(true), 0.5);
  EXPECT_LT(waited_share(false), 0.05);
}

}  // namespace
}  // namespace shardwise::train
