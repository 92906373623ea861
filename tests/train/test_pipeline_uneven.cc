// Interleaved pipelines whose layers do not divide into the p x v chunks (Llama 3's 126 layers on
// 16 ranks x 4 virtual stages): pipeline::split_layers gives the middle chunks the extra layers,
// the first and the last chunk fewer. A tiny Llama of 6 layers on pp=2 x 2 virtual stages (chunks
// of 1, 2, 2 and 1 layers) holds those layers on its ranks and trains the one-rank loss curve.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "shardwise/comm/local.h"
#include "tests/support/llama_config.h"
#include "shardwise/train/staged.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

TrainConfig tiny_llama(const std::string& mesh, int layers) {
  TrainConfig c = llama_test_config(mesh, 10);
  c.model.layers = layers;
  c.optimizer.accumulation = 4;  // a multiple of the 2 pipeline ranks, as interleaving needs
  if (mesh != "dp=1") c.parallel.schedule = "interleaved", c.parallel.virtual_stages = 2;
  return c;
}

std::vector<double> losses(TrainConfig c) {
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  c.check(ranks);
  std::vector<double> out;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& world) {
    Trainer t(c, world.group(world.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      const StepResult r = t.step();
      if (world.rank() == 0) out.push_back(r.loss);
    }
  });
  return out;
}

// The transformer layers whose parameters pipeline rank `rank`'s stage graphs hold.
std::set<int> layers_held(const TrainConfig& c, int rank) {
  const Strategy strategy = Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), false);
  const StageLayout layout = stage_layout(kernel_model(c), strategy, pipeline_config(c), 4);
  std::set<int> out;
  const std::regex layer(R"(^model\.layers\.(\d+)\.)");
  for (const pipeline::StageSpec& spec : stage_specs(kernel_model(c), layout, pipeline_config(c), 2, rank,
                                                     StageGraph::Training)) {
    for (graph::ValueId v : spec.graph->params()) {
      std::smatch m;
      const std::string& name = spec.graph->value(v).name;
      if (std::regex_search(name, m, layer)) out.insert(std::stoi(m[1]));
    }
  }
  return out;
}

TEST(PipelineUneven, SixLayersInFourChunksPutFewerOnTheFirstAndLastChunk) {
  const TrainConfig c = tiny_llama("pp=2", 6);
  // Chunks 0..3 hold 1, 2, 2, 1 layers; rank 0 runs chunks 0 and 2, rank 1 chunks 1 and 3.
  EXPECT_EQ(layers_held(c, 0), (std::set<int>{0, 3, 4}));
  EXPECT_EQ(layers_held(c, 1), (std::set<int>{1, 2, 5}));
}

TEST(PipelineUneven, AnUnevenInterleavedSplitTrainsTheOneRankLossCurve) {
  const std::vector<double> ref = losses(tiny_llama("dp=1", 6));
  const std::vector<double> got = losses(tiny_llama("pp=2", 6));
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_LT(ref.back(), ref.front());
  // The tolerance of the other pipeline tests (test_pipeline_topology.cc): the order of sums only.
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * std::abs(ref[i])) << "step " << i + 1;
}

}  // namespace
}  // namespace shardwise::train
