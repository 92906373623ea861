// A GPT-2 block (attention + MLP, layer norms, residuals, tied head, cross-entropy) on meshes
// [2], [4], [2,2] under data-, tensor- (Megatron, vocab-parallel embedding), sequence-parallel
// annotations and their combinations: loss, logits and every parameter gradient equal the
// single-device run. And the Megatron annotation performs exactly Megatron-LM's collectives.
#include <gtest/gtest.h>

#include "harness.h"
#include "transformer_block.h"

namespace shardwise {
namespace {

using testing_support::BlockConfig;
using testing_support::RunResult;
using testing_support::run_graph;

using Placements = std::map<std::string, std::string>;

// Megatron tensor parallelism on mesh dim `tp` of an n-dim mesh: q/k/v/fc1 column-parallel (bias
// too), attn_out/fc2 row-parallel, the embedding vocab-parallel.
Placements megatron(int ndim, int tp, bool vocab_parallel) {
  auto on_tp = [&](const char* p) {
    std::vector<std::string> parts(static_cast<size_t>(ndim), "R");
    parts[static_cast<size_t>(tp)] = p;
    return fmt::format("{}", fmt::join(parts, ","));
  };
  Placements out;
  for (const char* col : {"q", "k", "v", "fc1"}) {
    out[std::string(col) + ".weight"] = on_tp("S(1)");
    out[std::string(col) + ".bias"] = on_tp("S(0)");
  }
  out["attn_out.weight"] = on_tp("S(0)");
  out["fc2.weight"] = on_tp("S(0)");
  if (vocab_parallel) out["wte"] = on_tp("S(0)");
  return out;
}

struct Case {
  std::string name;
  std::vector<int64_t> mesh;
  Placements placements;
  bool embedding = true;
  bool vocab_parallel_loss = false;
};

class BlockOnMesh : public testing::TestWithParam<Case> {};

TEST_P(BlockOnMesh, EqualsTheSingleDeviceRun) {
  BlockConfig cfg;
  cfg.embedding = GetParam().embedding;
  cfg.vocab_parallel_loss = GetParam().vocab_parallel_loss;
  auto data = testing_support::block_data(cfg);
  std::vector<std::string> outputs = {"loss", "x2"};
  RunResult ref = run_graph([&](graph::Graph& g) { build_block(g, cfg, {}); }, mesh::ProcessMesh(Shape{1}), data, "loss",
                            outputs);
  RunResult got = run_graph([&](graph::Graph& g) { build_block(g, cfg, GetParam().placements); },
                            mesh::ProcessMesh(Shape(std::span<const int64_t>(GetParam().mesh))), data, "loss", outputs);
  for (const auto& [name, t] : ref.values) {
    CompareResult c = compare(got.values.at(name), t, 2e-5, 2e-6);
    EXPECT_TRUE(c.equal) << name << ": " << c.message << "\n" << got.plan;
  }
  for (const auto& [name, t] : ref.grads) {
    CompareResult c = compare(got.grads.at(name), t, 2e-5, 2e-6);
    EXPECT_TRUE(c.equal) << "gradient of " << name << ": " << c.message << "\n" << got.plan;
  }
}

Placements merged(Placements a, const Placements& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

// Sequence parallelism on tp (mesh dim `tp` of `ndim`): the residual stream and the norms are
// sharded on the sequence; the column-parallel inputs are gathered, the row-parallel outputs
// reduce-scattered back onto the sequence.
Placements sequence_parallel(int ndim, int tp, const char* dp_part) {
  auto at = [&](const char* tp_part) {
    std::vector<std::string> parts(static_cast<size_t>(ndim), "R");
    parts[static_cast<size_t>(tp)] = tp_part;
    if (ndim == 2) parts[static_cast<size_t>(1 - tp)] = dp_part;
    return fmt::format("{}", fmt::join(parts, ","));
  };
  Placements p = megatron(ndim, tp, true);
  p["x0"] = at("S(1)");
  p["ln1"] = at("R");
  p["ln2"] = at("R");
  p["attn_out.mm"] = at("S(1)");
  p["fc2.mm"] = at("S(1)");
  return p;
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, BlockOnMesh,
    testing::Values(Case{"dp2", {2}, {{"ids", "S(0)"}, {"labels", "S(0)"}}},
                    Case{"dp4", {4}, {{"ids", "S(0)"}, {"labels", "S(0)"}}},
                    Case{"tp2", {2}, megatron(1, 0, false)},
                    Case{"tp2_vocab_parallel", {2}, megatron(1, 0, true)},
                    Case{"tp4_vocab_parallel", {4}, megatron(1, 0, true)},
                    Case{"sp2", {2}, sequence_parallel(1, 0, "R")},
                    Case{"dp2_tp2", {2, 2}, merged(megatron(2, 1, true), {{"ids", "S(0),R"}, {"labels", "S(0),R"}})},
                    Case{"dp2_sp2", {2, 2}, merged(sequence_parallel(2, 1, "S(0)"), {{"ids", "S(0),R"}, {"labels", "S(0),R"}})},
                    Case{"tp2_dp2_swapped_dims", {2, 2}, merged(megatron(2, 0, true), {{"ids", "R,S(0)"}, {"labels", "R,S(0)"}})},
                    Case{"block_only_tp2", {2}, megatron(1, 0, false), false},
                    Case{"tp4_vocab_parallel_loss", {4}, megatron(1, 0, true), true, true},
                    Case{"dp2_tp2_vocab_parallel_loss", {2, 2},
                         merged(megatron(2, 1, true), {{"ids", "S(0),R"}, {"labels", "S(0),R"}}), true, true}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// Megatron-LM's tensor parallelism performs, per transformer block, one all-reduce after the
// attention's row-parallel projection and one after the MLP's in forward, and one for each of the
// two column-parallel inputs' gradients in backward: four all-reduces, nothing else.
TEST(Megatron, OneBlockPerformsExactlyMegatronsCollectives) {
  BlockConfig cfg;
  cfg.embedding = false;  // the block alone: its input is a previous layer's output
  graph::Graph g;
  build_block(g, cfg, megatron(1, 0, false));
  graph::append_backward(g, g.get("loss"));
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{2})));
  EXPECT_EQ(p.collective_counts(), (std::vector<std::pair<std::string, int>>{{"all_reduce", 4}})) << p.to_string(g);
  if (std::getenv("SHOW_PLAN")) std::cout << p.to_string(g);
}

// Sharding stage 2's lowering: on dp=2 every parameter gradient comes out P(sum) on dp; with
// LowerOptions::partial_grad_dims it stays so (the caller reduce-scatters it), and the all-reduce
// of each parameter gradient is gone from the program.
TEST(Megatron, PartialGradDimsLeaveParameterGradientsPartialOverDp) {
  graph::Graph g;
  build_block(g, BlockConfig{}, {{"ids", "S(0)"}, {"labels", "S(0)"}});
  graph::append_backward(g, g.get("loss"));
  const mesh::ProcessMesh m(Shape{2});
  auto all_reduces = [&](const graph::Program& p) {
    int n = 0;
    for (const auto& [kind, count] : p.collective_counts()) n += kind == "all_reduce" ? count : 0;
    return n;
  };
  graph::Program plain = graph::lower(g, graph::complete(g, m));
  graph::LowerOptions o;
  o.partial_grad_dims = {0};
  graph::Program partial = graph::lower(g, graph::complete(g, m), o);
  const int params = static_cast<int>(g.params().size());
  ASSERT_GT(params, 0);
  for (size_t i = 0; i < g.params().size(); ++i) {
    EXPECT_TRUE(plain.slots[static_cast<size_t>(plain.param_grad_slot[i])].dist[0].is_replicate());
    EXPECT_TRUE(partial.slots[static_cast<size_t>(partial.param_grad_slot[i])].dist[0].is_partial(mesh::ReduceOp::Sum))
        << g.value(g.params()[i]).name;
  }
  EXPECT_EQ(all_reduces(plain) - all_reduces(partial), params) << partial.to_string(g);
}

}  // namespace
}  // namespace shardwise
