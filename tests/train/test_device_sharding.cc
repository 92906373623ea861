// Sharding stages and LoRA on the fake device (`train --device fake --sharding-stage N`,
// `--lora-rank R`): the sharded optimizer's ranges, the reduce-scatter of the gradients (in the
// trainer or by reduce-scatter buckets) and the all-gather of the updated parameters on device
// memory; stage 3's parameters gathered in the graph; LoRA's frozen base on the device. Each run
// equals the `--device cpu` run bit for bit: losses, gradient norms, the masters after the last
// step, the checkpoint's files byte for byte (LoRA: the saved adapter), and what each rank holds
// (the memory plan's state bytes); the host reads the loss and the sums of squares only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/ckpt/commit.h"
#include "shardwise/train/memory_plan.h"
#include "tests/support/device_trainer.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

// A mesh as a test name's part: "dp=2,tp=2" -> "dp2_tp2".
std::string mesh_name(std::string mesh) {
  std::erase(mesh, '=');
  std::replace(mesh.begin(), mesh.end(), ',', '_');
  return mesh;
}

// Device and CPU curves of `c`, each saved after `steps`: every number and file the same.
void expect_device_equals_cpu(TrainConfig c, int64_t steps, const std::string& name, const CurveIo& io = {}) {
  const int64_t ranks = mesh::parse_mesh(c.parallel.mesh).size();
  CurveIo on_cpu = io, on_dev = io;
  on_cpu.save = fresh_dir("sharding-" + name + "-cpu"), on_dev.save = fresh_dir("sharding-" + name + "-dev");
  const Curve cpu = run_curve(c, steps, on_cpu);
  c.device = kFake;
  const Curve dev = run_curve(c, steps, on_dev);
  ASSERT_EQ(dev.losses.size(), static_cast<size_t>(steps));
  for (size_t s = 0; s < dev.losses.size(); ++s) {
    EXPECT_EQ(dev.losses[s], cpu.losses[s]) << "step " << s + 1;
    EXPECT_EQ(dev.norms[s], cpu.norms[s]) << "step " << s + 1;
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());  // it trains
  // Per step and rank: each micro-batch's loss and one vector of sums of squares to the host, each
  // micro-batch's ids and labels to the device; nothing of the sharded update crosses.
  EXPECT_EQ(dev.copies.to_host_copies, steps * ranks * (dev.accumulation + 1));
  EXPECT_EQ(dev.copies.to_device_copies, steps * ranks * dev.accumulation * 2);
  for (const auto& [param, whole] : cpu.params) {
    ASSERT_TRUE(dev.params.contains(param)) << param;
    EXPECT_EQ(std::memcmp(dev.params.at(param).raw(), whole.raw(), whole.nbytes()), 0) << param;
  }
  expect_same_files(ckpt::find_resume(on_cpu.save)->dir, ckpt::find_resume(on_dev.save)->dir);
  // What each rank holds: the CPU's bytes, the plan's state bytes.
  c.check(ranks, false);  // the batch split the plan reads
  const MemoryPlan plan = plan_memory(c, true);
  ASSERT_EQ(plan.ranks.size(), dev.held.size());
  for (size_t r = 0; r < dev.held.size(); ++r) {
    const HeldBytes &d = dev.held[r], &h = cpu.held[r];
    EXPECT_EQ(d.params, h.params) << "rank " << r;
    EXPECT_EQ(d.optimizer, h.optimizer) << "rank " << r;
    EXPECT_EQ(d.grads, h.grads) << "rank " << r;
    EXPECT_EQ(d.activations, h.activations) << "rank " << r;
    EXPECT_EQ(d.gathered, h.gathered) << "rank " << r;
    EXPECT_EQ(plan.ranks[r].params, d.params) << "rank " << r;
    EXPECT_EQ(plan.ranks[r].optimizer + plan.ranks[r].masters, d.optimizer) << "rank " << r;
  }
}

struct Sharded {
  std::string model, mesh;
  int stage = 1;
  std::string layout = "v1";
  bool bf16 = false;
  int prefetch = 0;
  std::string overlap = "off";  // gradient buckets: stage 2's reduce-scatter buckets on the device
  std::string name() const {
    return model + "_" + mesh_name(mesh) + "_stage" + std::to_string(stage) + (stage < 3 ? "_" + layout : "") + (bf16 ? "_bf16" : "") +
           (prefetch ? "_prefetch" : "") + (overlap == "off" ? "" : "_overlap_" + overlap);
  }
  friend void PrintTo(const Sharded& s, std::ostream* os) { *os << s.name(); }
};

class DeviceSharding : public FakeDeviceTest, public testing::WithParamInterface<Sharded> {};

TEST_P(DeviceSharding, CurveMastersCheckpointAndHeldBytesEqualTheCpu) {
  const Sharded& k = GetParam();
  TrainConfig c = k.model == "gpt2" ? small_config(k.mesh, 3) : llama_test_config(k.mesh, 3);
  c.parallel.sharding = {k.stage, k.layout};
  c.parallel.sharding.prefetch_params = k.prefetch;
  c.parallel.overlap_grad_reduce = k.overlap;
  c.parallel.grad_bucket_mb = 0.01;  // several buckets
  c.bf16 = k.bf16;
  expect_device_equals_cpu(c, 3, k.name());
}

INSTANTIATE_TEST_SUITE_P(
    Runs, DeviceSharding,
    testing::Values(Sharded{"gpt2", "dp=2", 1, "v1"}, Sharded{"llama", "dp=2", 1, "v2", true},
                    Sharded{"gpt2", "dp=2", 2, "v1", true}, Sharded{"llama", "dp=2,tp=2", 2, "v2"},
                    Sharded{"gpt2", "dp=2,tp=2", 1, "v2", true}, Sharded{"llama", "dp=2", 2, "v1", false, 0, "on"},
                    Sharded{"gpt2", "dp=2", 2, "v2", true, 0, "after"}, Sharded{"gpt2", "dp=2", 3},
                    Sharded{"llama", "dp=2", 3, "v1", true}, Sharded{"gpt2", "dp=2,tp=2", 3, "v1", true, 1},
                    Sharded{"llama", "dp=2,tp=2", 3, "v1", false, 1}),
    [](const testing::TestParamInfo<Sharded>& info) { return info.param.name(); });

// A sharded checkpoint saved on the device loads on the device (each rank's ranges through the host)
// and the curve goes on as the whole CPU run's.
TEST_F(FakeDeviceTest, ASavedShardedCheckpointResumesOnTheDevice) {
  for (const int stage : {2, 3}) {
    TrainConfig c = llama_test_config("dp=2", 5);
    c.parallel.sharding = {stage, "v2"};
    c.bf16 = true;
    const Curve whole = run_curve(c, 5);
    c.device = kFake;
    const fs::path dir = fresh_dir("sharding-resume-stage" + std::to_string(stage));
    run_curve(c, 3, {.load = {}, .save = dir});
    const Curve rest = run_curve(c, 2, {.load = ckpt::find_resume(dir)->dir, .save = {}});
    ASSERT_EQ(rest.losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(rest.losses[s], whole.losses[3 + s]) << "stage " << stage << ", step " << 4 + s;
      EXPECT_EQ(rest.norms[s], whole.norms[3 + s]) << "stage " << stage << ", step " << 4 + s;
    }
  }
}

// Stage 3's prefetched gathers on a device run ahead on the communication stream: the compute stream
// launches kernels between a gather's event and its wait for it (without prefetch, none: each gather
// is waited for where it is queued).
TEST_F(FakeDeviceTest, PrefetchedGathersRunAheadOnTheCommunicationStream) {
  for (const int prefetch : {0, 1}) {
    TrainConfig c = small_config("dp=2", 1);
    c.parallel.sharding = {3, "v1"};
    c.parallel.sharding.prefetch_params = prefetch;
    c.device = kFake;
    fake_->clear_stream_log();
    run_curve(c, 1);
    using K = FakeDeviceMemory::StreamEvent::Kind;
    const std::vector<FakeDeviceMemory::StreamEvent> log = fake_->stream_log();
    std::set<void*> compute;  // the streams kernels launch on
    for (const auto& e : log)
      if (e.kind == K::Launch) compute.insert(e.stream);
    std::map<uint64_t, std::pair<void*, size_t>> recorded;  // event: its stream, its place in the log
    int64_t waits = 0, most_between = 0;
    for (size_t i = 0; i < log.size(); ++i) {
      const auto& e = log[i];
      if (e.kind == K::Record) recorded[e.event] = {e.stream, i};
      if (e.kind != K::Wait || !compute.contains(e.stream) || compute.contains(recorded.at(e.event).first)) continue;
      ++waits;  // the compute stream waits for a reshard: count its launches since the reshard's event
      int64_t between = 0;
      for (size_t j = recorded.at(e.event).second; j < i; ++j)
        between += log[j].kind == K::Launch && log[j].stream == e.stream ? 1 : 0;
      most_between = std::max(most_between, between);
    }
    EXPECT_GT(waits, 0) << "prefetch " << prefetch;
    if (prefetch) EXPECT_GT(most_between, 0);
    else EXPECT_EQ(most_between, 0);
  }
}

// The sharded optimizer's fresh moments are zero-filled where the update reads them: on the
// compute stream. Before, they were filled on the default stream, which a CUDA compute stream
// (non-blocking) does not wait for, with no host wait between.
TEST_F(FakeDeviceTest, TheShardedOptimizersMomentsAreFilledOnTheComputeStream) {
  TrainConfig c = small_config("dp=2", 1);
  c.parallel.sharding = {1, "v1"};
  c.device = kFake;
  fake_->clear_stream_log();
  run_curve(c, 1);
  using K = FakeDeviceMemory::StreamEvent::Kind;
  const std::vector<FakeDeviceMemory::StreamEvent> log = fake_->stream_log();
  std::set<void*> compute;
  for (const auto& e : log)
    if (e.kind == K::Launch) compute.insert(e.stream);
  int64_t fills = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].kind != K::Fill) continue;
    ++fills;
    if (compute.contains(log[i].stream)) continue;
    // Elsewhere, the host must wait for that stream before any compute stream launches.
    bool waited = false;
    for (size_t j = i + 1; j < log.size() && !waited; ++j) {
      if (log[j].kind == K::Synchronize && log[j].stream == log[i].stream) waited = true;
      if (log[j].kind == K::Launch) break;
    }
    EXPECT_TRUE(waited) << "a zero fill on stream " << log[i].stream << " (log entry " << i
                        << ") that no compute stream waits for";
  }
  EXPECT_GT(fills, 0);  // the moments
}

// LoRA: the base from a transformers directory (--init-from) frozen on the device, the adapters
// trained there; the saved adapter (PEFT's files) is the CPU run's byte for byte.
struct Lora {
  std::string model, mesh;
  bool bf16 = false;
  friend void PrintTo(const Lora& l, std::ostream* os) { *os << l.model << " on " << l.mesh << (l.bf16 ? " bf16" : ""); }
};

class DeviceLora : public FakeDeviceTest, public testing::WithParamInterface<Lora> {};

TEST_P(DeviceLora, AdaptersTrainOnTheDeviceAsOnTheCpu) {
  const std::string hf = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf/";
  const Lora& k = GetParam();
  const bool gpt2 = k.model == "gpt2";
  TrainConfig c = golden_fine_tune(hf + (gpt2 ? "gpt2_tiny" : "llama_tiny"), hf + (gpt2 ? "tokens.bin" : "llama_tokens.bin"), k.mesh);
  c.model.lora = read_adapter_config(hf + (gpt2 ? "lora_gpt2" : "lora_llama"));
  c.optimizer.steps = 3;
  c.optimizer.lr = 1e-2, c.optimizer.warmup = 1;
  c.bf16 = k.bf16;
  std::string name = k.model + "-lora-" + k.mesh + (k.bf16 ? "-bf16" : "");
  expect_device_equals_cpu(c, 3, name, {.load = {}, .save = {}, .init_from = hf + (gpt2 ? "gpt2_tiny" : "llama_tiny")});
}

INSTANTIATE_TEST_SUITE_P(Runs, DeviceLora,
                         testing::Values(Lora{"gpt2", "dp=1"}, Lora{"gpt2", "dp=2,tp=2"}, Lora{"llama", "tp=2", true},
                                         Lora{"llama", "dp=2"}),
                         [](const testing::TestParamInfo<Lora>& info) {
                           return info.param.model + "_" + mesh_name(info.param.mesh) + (info.param.bf16 ? "_bf16" : "");
                         });

}  // namespace
}  // namespace shardwise::train
