// Pipelines on the fake device (`train --device fake --mesh pp=...`): the stages' activations and
// gradients move between pipeline ranks as device tensors (copies between the rank threads' device
// buffers), and GPT-2's embedding, tied across the first and the last stage, sums its two
// gradients there. GPT-2 and Llama tiny on pp=2 under 1f1b, interleaved (--virtual 2), zbh1 and
// fthenb, an uneven split, without --pipeline-release, and on pp=2 x dp=2 and pp=2 x tp=2 threads,
// f32 and --bf16: the losses, gradient norms, peak activation bytes and checkpoint files (the masters,
// the moments)
// equal the same run's on the CPU bit for bit.
//
// The host's copies a step: each micro-batch's ids into the first stage's ranks and its labels into
// the last stage's (one copy a rank and micro-batch, where a run without pp copies both into every
// rank), its loss out of the last stage's ranks (one copy each; the other stages read none), and
// one vector of sums of squares out of every rank. Stage-to-stage moves add none.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "shardwise/ckpt/commit.h"
#include "tests/support/device_curves.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string model, mesh, schedule = "1f1b";
  bool bf16 = false;
  int64_t layers = 4;
  bool release = true;  // --pipeline-release
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.model << " on " << c.mesh << " " << c.schedule << " layers " << c.layers << (c.bf16 ? " bf16" : "")
        << (c.release ? "" : " no release");
  }
};

constexpr int64_t kSteps = 3;

TrainConfig config_of(const Case& k) {
  TrainConfig c = k.model == "gpt2" ? small_config(k.mesh, kSteps) : llama_test_config(k.mesh, kSteps);
  c.model.layers = k.layers;
  c.parallel.schedule = k.schedule;
  c.parallel.virtual_stages = k.schedule == "interleaved" ? 2 : 1;
  c.parallel.pipeline_release = k.release;
  c.optimizer.accumulation = 4, c.optimizer.micro_batch = 0;  // 4 micro-batches (interleaved: a multiple of pp)
  c.bf16 = k.bf16;
  return c;
}

class DevicePipeline : public FakeDeviceTest, public testing::WithParamInterface<Case> {};

TEST_P(DevicePipeline, FakeDeviceEqualsTheCpuBitForBitCurveAndCheckpoint) {
  TrainConfig c = config_of(GetParam());
  const int64_t ranks = mesh::parse_mesh(c.parallel.mesh).size(), stage_ranks = ranks / 2;
  const CpuAndFake r = expect_fake_curve_is_the_cpus(c, kSteps, "pipeline");
  const Curve &cpu = r.cpu, &dev = r.dev;
  EXPECT_EQ(dev.activation_bytes, cpu.activation_bytes);
  EXPECT_GT(cpu.activation_bytes, 0);
  const int64_t micro = dev.accumulation;
  ASSERT_EQ(micro, 4);
  EXPECT_EQ(dev.copies.to_host_copies, kSteps * (stage_ranks * micro + ranks));
  EXPECT_EQ(dev.copies.to_device_copies, kSteps * ranks * micro);
  expect_same_files(ckpt::find_resume(r.dirs[0])->dir, ckpt::find_resume(r.dirs[1])->dir);
  for (const fs::path& d : r.dirs) fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(
    Runs, DevicePipeline,
    testing::Values(Case{"gpt2", "pp=2"}, Case{"llama", "pp=2"}, Case{"gpt2", "pp=2", "interleaved"},
                    Case{"llama", "pp=2", "interleaved", true}, Case{"gpt2", "pp=2", "zbh1", true},
                    Case{"llama", "pp=2", "zbh1"}, Case{"gpt2", "pp=2", "fthenb"}, Case{"gpt2", "pp=2", "1f1b", false, 3},
                    Case{"gpt2", "pp=2", "1f1b", false, 4, false}, Case{"gpt2", "pp=2,dp=2"},
                    Case{"llama", "pp=2,dp=2", "1f1b", true}, Case{"gpt2", "pp=2,tp=2", "1f1b", true},
                    Case{"llama", "pp=2,tp=2"}),
    [](const testing::TestParamInfo<Case>& info) {
      const Case& k = info.param;
      std::string mesh = k.mesh;
      if (const size_t comma = mesh.find(','); comma != std::string::npos) mesh[comma] = '_';
      std::erase(mesh, '=');
      return k.model + "_" + mesh + "_" + k.schedule + (k.layers == 4 ? "" : "_layers" + std::to_string(k.layers)) +
             (k.bf16 ? "_bf16" : "") + (k.release ? "" : "_no_release");
    });

// A pipeline rank's stages (interleaved: 2 a rank) run on one compute stream, so what one stage
// makes, another stage and the optimizer read in order on a GPU: the kernels of 2 ranks x 2
// stages launch on 2 streams. The host waits only on those (the loss, the norm; and the default
// stream, moving the state in), and no transfer between stages opens device memory for the host.
TEST_F(FakeDeviceTest, APipelineRankRunsItsStagesOnOneComputeStream) {
  auto& fake = dynamic_cast<FakeDeviceMemory&>(device_memory(kFake));
  TrainConfig c = config_of(Case{"gpt2", "pp=2", "interleaved"});
  c.device = kFake;
  fake.clear_stream_log();
  run_curve(c, 2);
  std::set<void*> launched_on;
  using K = FakeDeviceMemory::StreamEvent::Kind;
  const std::vector<FakeDeviceMemory::StreamEvent> log = fake.stream_log();
  for (const FakeDeviceMemory::StreamEvent& e : log)
    if (e.kind == K::Launch) launched_on.insert(e.stream);
  EXPECT_EQ(launched_on.size(), 2u);
  for (const FakeDeviceMemory::StreamEvent& e : log) {  // the default stream: the state's moves at the start
    const bool allowed = launched_on.contains(e.stream) || e.stream == nullptr;
    if (e.kind == K::Synchronize) {
      EXPECT_TRUE(allowed) << "a host wait on " << e.stream;
    }
    if (e.kind == K::HostOpen) {
      EXPECT_TRUE(allowed) << "a host window on " << e.stream;
    }
  }
}

// Evaluation between steps runs on the training runner's streams: the optimizer's writes to the
// parameters on the compute stream come before the evaluation's reads of them (its own streams
// would read them with no event between). Before, the evaluation launched on two more streams.
TEST_F(FakeDeviceTest, EvaluationRunsOnTheTrainingRunnersStreams) {
  auto& fake = dynamic_cast<FakeDeviceMemory&>(device_memory(kFake));
  for (const char* mesh : {"dp=1", "pp=2"}) {
    TrainConfig c = config_of(Case{"gpt2", mesh, "1f1b"});
    c.device = kFake;
    const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
    fake.clear_stream_log();
    comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      t.step();
      (void)t.evaluate();
      t.step();
    });
    std::set<void*> launched_on;
    for (const FakeDeviceMemory::StreamEvent& e : fake.stream_log())
      if (e.kind == FakeDeviceMemory::StreamEvent::Kind::Launch) launched_on.insert(e.stream);
    EXPECT_EQ(launched_on.size(), static_cast<size_t>(ranks)) << mesh;  // each rank's compute stream
  }
}

}  // namespace
}  // namespace shardwise::train
