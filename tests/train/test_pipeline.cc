// Pipeline execution: the gradients of one step equal a single-rank run of the whole model (an
// independent reference: one graph, one runtime, the micro-batches summed in a loop), with
// released tensors poisoned (NaN) so that a released value a kernel reads would show; the peak
// activation bytes each rank measures equal the simulator's prediction from the measured frame
// bytes; and FThenB holds less with release than without.
#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "shardwise/comm/local.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/pipeline/simulate.h"
#include "shardwise/models/models.h"
#include "shardwise/train/staged.h"

namespace shardwise::train {
namespace {

GptConfig small_model(int64_t layers) {
  GptConfig m;
  m.layers = layers, m.heads = 4, m.hidden = 32, m.seq = 10, m.vocab = 128;
  return m;
}

constexpr int64_t kMicroBatch = 2;
constexpr int kMicroBatches = 4;
constexpr uint64_t kSeed = 1234;

// The reference: the whole model on one rank, gradients summed over the micro-batches.
std::map<std::string, Tensor> single_rank_grads(const GptConfig& model, const Dataset& data,
                                                int micro_batches = kMicroBatches) {
  std::map<std::string, Tensor> out;
  comm::LocalWorld::run(1, [&](comm::Communicator& world) {
    Strategy s = Strategy::from_mesh(mesh::parse_mesh("dp=1"), false);
    GptGraph gpt = build_gpt(model, s, kMicroBatch);
    graph::append_backward(gpt.g, gpt.loss);
    graph::Program p = graph::lower(gpt.g, graph::complete(gpt.g, s.mesh));
    runtime::Runtime rt(gpt.g, p, world.group(world.members()));
    for (graph::ValueId v : gpt.g.params()) {
      const auto& val = gpt.g.value(v);
      rt.set_global(val.name, init_param(model, val.name, val.meta.shape, kSeed));
    }
    for (const auto& [name, t] : model_constants(model)) rt.set_global(name, t);  // none with fused attention
    for (int a = 0; a < micro_batches; ++a) {
      Batch b = make_batch(data, a * kMicroBatch, kMicroBatch, model.seq);
      rt.set_global("ids", b.ids);
      rt.set_global("labels", b.labels);
      rt.run();
      for (graph::ValueId v : gpt.g.params()) {
        const std::string& name = gpt.g.value(v).name;
        Tensor g = rt.local_grad(name);
        if (a == 0) {
          out[name] = g.clone();
        } else {
          for (int64_t j = 0; j < g.numel(); ++j) out[name].data<float>()[j] += g.data<float>()[j];
        }
      }
    }
  });
  return out;
}

struct PipelineStep {
  std::map<std::string, Tensor> grads;  // every rank's parameters (stage meshes of one process)
  std::vector<std::string> problems;    // peak mismatches
  std::vector<int64_t> peaks;           // per pipeline rank
  bool shared_storage = false;          // two gradients, or a gradient and a parameter, share storage
};

PipelineStep run_pipeline(const GptConfig& model, const std::string& mesh, const PipelineConfig& pc, const Dataset& data,
                          int micro_batches = kMicroBatches) {
  PipelineStep out;
  Strategy strategy = Strategy::from_mesh(mesh::parse_mesh(mesh), false);
  std::mutex mu;
  const int ranks = static_cast<int>(strategy.mesh.size());
  out.peaks.assign(static_cast<size_t>(ranks), 0);
  comm::LocalWorld::run(ranks, [&](comm::Communicator& world) {
    StagedGpt pp(model, strategy, pc, kMicroBatch, micro_batches, kSeed, causal_mask(model.seq),
                 world.group(world.members()));
    StagedGpt::Result r = pp.forward_backward(&data, 0);
    // The simulator's peak for this rank from the frame bytes it measured for its stages.
    const pipeline::StepStats& st = pp.last_stats();
    const pipeline::Schedule& sch = pp.schedule();
    pipeline::SimOptions sim;
    sim.stages.assign(static_cast<size_t>(sch.stages()), pipeline::StageCosts{1, 2, 1, 1, 0, 0});
    for (auto [stage, bytes] : st.forward_bytes) sim.stages[static_cast<size_t>(stage)].activation_bytes = bytes;
    for (auto [stage, bytes] : st.weight_grad_bytes) sim.stages[static_cast<size_t>(stage)].weight_grad_bytes = bytes;
    const int me = pp.runner().pipeline_rank();
    int64_t predicted = pipeline::simulate(sch, sim).ranks[static_cast<size_t>(me)].peak_bytes;
    std::lock_guard lock(mu);
    out.peaks[static_cast<size_t>(world.rank())] = st.peak_activation_bytes;
    if (predicted != st.peak_activation_bytes || predicted <= 0)
      out.problems.push_back(fmt::format("{} rank {}: measured peak {} B, simulated {} B", sch.name, world.rank(),
                                         st.peak_activation_bytes, predicted));
    std::set<const std::byte*> storage;
    for (size_t i = 0; i < pp.params().size(); ++i) {
      out.grads[pp.params()[i].name] = r.grads[i];
      out.shared_storage |= !storage.insert(r.grads[i].raw()).second || !storage.insert(pp.params()[i].param.raw()).second;
    }
  });
  return out;
}

void expect_same_grads(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& ref,
                       const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (const auto& [name, g] : ref) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": no gradient for " << name;
    CompareResult c = compare(it->second, g, 1e-5, 1e-7);
    EXPECT_TRUE(c.equal) << what << ": " << name << ": " << c.message;
  }
}

TEST(Pipeline, GradientsOfEveryScheduleEqualTheSingleRankRun) {
  GptConfig model = small_model(4);
  AdditionTask data(2, model.seq, kSeed);
  auto ref = single_rank_grads(model, data);
  for (const char* mesh : {"pp=2", "pp=4"}) {
    for (const char* schedule : {"fthenb", "1f1b", "interleaved", "zbh1"}) {
      if (std::string(schedule) == "interleaved" && std::string(mesh) == "pp=4") continue;  // 4 layers < 8 stages
      PipelineConfig pc{schedule, std::string(schedule) == "interleaved" ? 2 : 1, true, true, {}};
      PipelineStep r = run_pipeline(model, mesh, pc, data);
      expect_same_grads(r.grads, ref, fmt::format("{} on {}", schedule, mesh));
      EXPECT_TRUE(r.problems.empty()) << fmt::format("{}", fmt::join(r.problems, "\n"));
    }
  }
  // Interleaved on pp=4 with 2 virtual stages per rank: 8 layers, one per stage.
  GptConfig eight = small_model(8);
  PipelineStep r = run_pipeline(eight, "pp=4", PipelineConfig{"interleaved", 2, true, true, {}}, data);
  expect_same_grads(r.grads, single_rank_grads(eight, data), "interleaved v=2 on pp=4");
  EXPECT_TRUE(r.problems.empty()) << fmt::format("{}", fmt::join(r.problems, "\n"));
}

// With one micro-batch the runner takes the backward's gradient tensors as its sums instead of
// copying them: the same bits as the single-rank runtime's gradients, on one stage and on two (the
// tied embedding's two parts summed), and no sum shares storage with another or with a parameter.
TEST(Pipeline, OneMicroBatchGivesTheSingleRankGradientsBitForBit) {
  GptConfig model = small_model(4);
  AdditionTask data(2, model.seq, kSeed);
  auto ref = single_rank_grads(model, data, 1);
  for (const char* mesh : {"dp=1", "pp=2"}) {
    PipelineStep r = run_pipeline(model, mesh, PipelineConfig{"1f1b", 1, true, true, {}}, data, 1);
    ASSERT_EQ(r.grads.size(), ref.size()) << mesh;
    for (const auto& [name, g] : ref) {
      CompareResult c = compare(r.grads.at(name), g, 0, 0);
      EXPECT_TRUE(c.equal) << mesh << ": " << name << ": " << c.message;
    }
    EXPECT_FALSE(r.shared_storage) << mesh;
  }
}

TEST(Pipeline, MeasuredPeakActivationsEqualTheSimulatorWithAndWithoutRelease) {
  GptConfig model = small_model(4);
  AdditionTask data(2, model.seq, kSeed);
  std::map<std::string, int64_t> first_rank_peak;
  for (bool release : {true, false}) {
    for (const char* schedule : {"fthenb", "1f1b", "zbh1"}) {
      PipelineStep r = run_pipeline(model, "pp=2", PipelineConfig{schedule, 1, release, false, {}}, data);
      EXPECT_TRUE(r.problems.empty()) << fmt::format("{}", fmt::join(r.problems, "\n"));
      first_rank_peak[fmt::format("{}/{}", schedule, release)] = r.peaks[0];
    }
  }
  // FThenB holds all 4 micro-batches, 1F1B at most 2 (p) on the first rank.
  EXPECT_EQ(first_rank_peak["fthenb/true"], 2 * first_rank_peak["1f1b/true"]);
  // Release frees what backward does not read: FThenB holds less.
  EXPECT_LT(first_rank_peak["fthenb/true"], first_rank_peak["fthenb/false"]);
  EXPECT_LT(first_rank_peak["1f1b/true"], first_rank_peak["1f1b/false"]);
}

}  // namespace
}  // namespace shardwise::train
