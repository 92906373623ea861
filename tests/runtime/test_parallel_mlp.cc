// A residual MLP with a layer norm, run on meshes [2], [4], [2,2] under data-, tensor- and
// sequence-parallel annotations: the loss, the output and every parameter gradient must equal the
// single-device run.
#include <gtest/gtest.h>

#include "harness.h"
#include "shardwise/core/philox.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise {
namespace {

using testing_support::RunResult;
using testing_support::run_graph;

constexpr int64_t B = 4, S = 6, H = 8, F = 16;

Tensor random(const Shape& s, uint64_t stream, double lo = -1, double hi = 1) {
  ops::ValueGen gen;
  gen.lo = lo, gen.hi = hi;
  return verify::random_tensor(s, DType::F32, gen, Philox(11, stream));
}

std::map<std::string, Tensor> data() {
  return {{"x", random(Shape{B, S, H}, 1)},       {"ln.scale", random(Shape{H}, 2, 0.5, 1.5)},
          {"ln.bias", random(Shape{H}, 3)},       {"fc1.weight", random(Shape{H, F}, 4, -0.5, 0.5)},
          {"fc1.bias", random(Shape{F}, 5)},      {"fc2.weight", random(Shape{F, H}, 6, -0.5, 0.5)},
          {"fc2.bias", random(Shape{H}, 7)}};
}

// placements: value name -> placements on the mesh (others unannotated).
std::function<void(graph::Graph&)> mlp(std::map<std::string, std::string> placements) {
  return [placements](graph::Graph& g) {
    auto x = g.input("x", Shape{B, S, H});
    auto s = g.param("ln.scale", Shape{H}), b = g.param("ln.bias", Shape{H});
    auto w1 = g.param("fc1.weight", Shape{H, F}), b1 = g.param("fc1.bias", Shape{F});
    auto w2 = g.param("fc2.weight", Shape{F, H}), b2 = g.param("fc2.bias", Shape{H});
    auto n = g.layer_norm(x, s, b, -1, 1e-5, "ln_out");
    auto h = g.gelu(g.add(g.matmul(n, w1, false, "fc1"), b1, "fc1_out"), "act");
    auto y = g.matmul(h, w2, false, "fc2");
    auto out = g.add(g.add(y, b2, "fc2_out"), x, "out");
    g.mean(g.multiply(out, out, "sq"), {}, false, "loss");
    for (const auto& [name, p] : placements) g.annotate(g.get(name), p);
  };
}

void expect_same(const RunResult& got, const RunResult& ref, const std::string& what) {
  for (const auto& [name, t] : ref.values) {
    CompareResult c = compare(got.values.at(name), t, 1e-5, 1e-6);
    EXPECT_TRUE(c.equal) << what << ": value " << name << ": " << c.message << "\n" << got.plan;
  }
  for (const auto& [name, t] : ref.grads) {
    CompareResult c = compare(got.grads.at(name), t, 1e-5, 1e-6);
    EXPECT_TRUE(c.equal) << what << ": gradient of " << name << ": " << c.message << "\n" << got.plan;
  }
}

struct Strategy {
  std::string name;
  std::vector<int64_t> mesh;
  std::map<std::string, std::string> placements;
};

class MlpOnMesh : public testing::TestWithParam<Strategy> {};

TEST_P(MlpOnMesh, EqualsTheSingleDeviceRun) {
  RunResult ref = run_graph(mlp({}), mesh::ProcessMesh(Shape{1}), data(), "loss", {"loss", "out"});
  const Strategy& s = GetParam();
  RunResult got = run_graph(mlp(s.placements), mesh::ProcessMesh(Shape(std::span<const int64_t>(s.mesh))), data(),
                            "loss", {"loss", "out"});
  expect_same(got, ref, s.name);
  if (getenv("SHOW_PLAN")) std::cout << got.plan << ref.values.at("loss").to_string() << "\n";
}

const std::map<std::string, std::string> kMegatron1D = {{"fc1.weight", "S(1)"}, {"fc2.weight", "S(0)"}};

INSTANTIATE_TEST_SUITE_P(
    Strategies, MlpOnMesh,
    testing::Values(
        Strategy{"dp2", {2}, {{"x", "S(0)"}}},
        Strategy{"dp4_uneven_seq", {4}, {{"x", "S(1)"}}},  // 6 positions over 4 ranks: 2, 2, 2, 0
        Strategy{"tp2", {2}, kMegatron1D},
        Strategy{"tp4", {4}, kMegatron1D},
        Strategy{"tp2_bias_sharded", {2}, {{"fc1.weight", "S(1)"}, {"fc1.bias", "S(0)"}, {"fc2.weight", "S(0)"}}},
        Strategy{"sp2", {2}, {{"x", "S(1)"}, {"ln_out", "R"}, {"fc1.weight", "S(1)"}, {"fc2.weight", "S(0)"}, {"fc2", "S(1)"}}},
        Strategy{"dp2_tp2", {2, 2}, {{"x", "S(0),R"}, {"fc1.weight", "R,S(1)"}, {"fc2.weight", "R,S(0)"}}},
        Strategy{"dp2_sp2", {2, 2},
                 {{"x", "S(0),S(1)"}, {"ln_out", "S(0),R"}, {"fc1.weight", "R,S(1)"}, {"fc2.weight", "R,S(0)"}, {"fc2", "S(0),S(1)"}}},
        Strategy{"tp2x2_coshard", {2, 2}, {{"fc1.weight", "S(1),S(1)"}, {"fc2.weight", "S(0),S(0)"}}}),
    [](const testing::TestParamInfo<Strategy>& info) { return info.param.name; });

}  // namespace
}  // namespace shardwise
