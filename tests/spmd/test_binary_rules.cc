// The broadcasting elementwise rules: explicit expectations for sharding, broadcast dims, every
// Partial pass-through (and the cases that must reshard), reverse and grad.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

TensorSpec spec(const Shape& shape, const char* dist, int mesh_ndim, DType dtype = DType::F64) {
  return {shape, dtype, parse_dist(dist, mesh_ndim)};
}

struct Got {
  std::vector<std::string> inputs, outputs;
};

Got strings(const SpmdResult& r) {
  Got g;
  for (const DistAttr& d : r.inputs) g.inputs.push_back(d.to_string());
  for (const DistAttr& d : r.outputs) g.outputs.push_back(d.to_string());
  return g;
}

using Strs = std::vector<std::string>;

// forward(rule, mesh, [shape, dist]...) -> required inputs and outputs as strings.
Got forward(const char* rule, const Shape& mesh_shape, std::vector<std::pair<Shape, const char*>> ins,
            DType dtype = DType::F64) {
  ProcessMesh mesh(mesh_shape);
  std::vector<TensorSpec> specs;
  for (auto& [s, d] : ins) specs.push_back(spec(s, d, mesh.ndim(), dtype));
  return strings(rules().get(rule).forward(mesh, specs, {}));
}

TEST(BinaryRules, Registered) {
  for (const char* name : {"elementwise_add", "elementwise_multiply", "elementwise_divide", "elementwise_max",
                           "elementwise_min", "elementwise_binary", "elementwise_where"}) {
    const Rule* r = rules().find(name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_EQ(r->family, "elementwise");
    EXPECT_FALSE(r->summary.empty());
  }
}

TEST(BinaryRules, ShardingKeptAndMerged) {
  // Same shapes: x's sharding is taken by y.
  Got g = forward("elementwise_add", {2}, {{{12, 6}, "S(0)"}, {{12, 6}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)"}));
  // Conflict on one mesh dim: the first input wins, y is resharded.
  g = forward("elementwise_add", {2}, {{{12, 6}, "S(0)"}, {{12, 6}, "S(1)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)"}));
  // Two mesh dims shard two different axes, one from each input.
  g = forward("elementwise_multiply", {2, 3}, {{{12, 6}, "S(0),R"}, {{12, 6}, "R,S(1)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),S(1)", "S(0),S(1)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),S(1)"}));
  // Co-sharding keeps its split order.
  g = forward("elementwise_add", {2, 2}, {{{12, 6}, "S(0)@1,S(0)@0"}, {{6}, "R,R"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)@1,S(0)@0", "R,R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)@1,S(0)@0"}));
}

TEST(BinaryRules, BroadcastAlignsRightAndNeverShardsBroadcastDims) {
  // 12x6 with 6: y's dim 0 is the output's dim 1.
  Got g = forward("elementwise_add", {2}, {{{12, 6}, "R"}, {{6}, "S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(1)", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(1)"}));
  // A sharded output dim that y lacks: y is R there.
  g = forward("elementwise_add", {2}, {{{12, 6}, "S(0)"}, {{6}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)"}));
  // 5x1 with 1x7: each input's size-1 dim is a broadcast dim, never sharded.
  g = forward("elementwise_add", {2, 2}, {{{5, 1}, "S(0),S(1)"}, {{1, 7}, "S(0),S(1)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),R", "R,S(1)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),S(1)"}));
  // 1x7 with 5x7: x's broadcast dim 0 may not carry y's sharding of dim 0.
  g = forward("elementwise_add", {3}, {{{1, 7}, "S(0)"}, {{5, 7}, "S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)"}));
  // Both size 1 on a dim: not a broadcast, the (tiny) dim may stay sharded.
  g = forward("elementwise_add", {2}, {{{1, 7}, "S(0)"}, {{1, 7}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "S(0)"}));
  // 3-D with 2-D.
  g = forward("elementwise_multiply", {2, 3}, {{{2, 3, 4}, "S(0),R"}, {{3, 1}, "R,S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),S(1)", "R,S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),S(1)"}));
}

TEST(BinaryRules, AddPartial) {
  // The brief's example: mesh [2,2], x=[S(0),P(sum)], y=[R,P(sum)] keeps P(sum).
  Got g = forward("elementwise_add", {2, 2}, {{{12, 6}, "S(0),P(sum)"}, {{12, 6}, "R,P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),P(sum)", "S(0),P(sum)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),P(sum)"}));
  g = forward("elementwise_add", {2}, {{{12, 6}, "P(avg)"}, {{6}, "P(avg)"}});
  EXPECT_EQ(g.outputs, (Strs{"P(avg)"}));
  g = forward("elementwise_add", {2}, {{{12, 6}, "P(sum)"}, {{12, 6}, "P(sum)"}});
  EXPECT_EQ(g.outputs, (Strs{"P(sum)"}));
  // P(sum) + R is not exact: both replicate.
  g = forward("elementwise_add", {2}, {{{12, 6}, "P(sum)"}, {{12, 6}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"R"}));
  // Mixed reduce ops, and max partials, replicate.
  for (const char* y : {"P(avg)", "P(max)"}) {
    g = forward("elementwise_add", {2}, {{{5, 7}, "P(sum)"}, {{5, 7}, y}});
    EXPECT_EQ(g.inputs, (Strs{"R", "R"})) << y;
    EXPECT_EQ(g.outputs, (Strs{"R"})) << y;
  }
  // Subtract shares the rule.
  g = forward("elementwise_add", {2, 3}, {{{5, 7}, "P(avg),P(sum)"}, {{5, 7}, "P(avg),R"}});
  EXPECT_EQ(g.inputs, (Strs{"P(avg),R", "P(avg),R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(avg),R"}));
}

TEST(BinaryRules, PartialLosesToShardingOnItsMeshDim) {
  // x is P(sum) on mesh dim 0, which y shards: the mesh dim is a Shard dim, x is resharded to S.
  Got g = forward("elementwise_multiply", {2}, {{{12, 6}, "P(sum)"}, {{12, 6}, "S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)"}));
  // y lacks the sharded letter (it is R on that mesh dim) but the mesh dim is x's: y's Partial
  // cannot pass there.
  g = forward("elementwise_multiply", {2}, {{{12, 6}, "S(0)"}, {{6}, "P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)"}));
  // Mesh dim 1: x P(sum); y's S(0) there lost the merge (letter a is already on mesh dim 0), so
  // y becomes R on mesh dim 1 and P(sum) x R passes.
  g = forward("elementwise_multiply", {2, 2}, {{{12, 6}, "S(0),P(sum)"}, {{12, 6}, "R,S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),P(sum)", "S(0),R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),P(sum)"}));
  // The same for add: P(sum) + R is not exact, so x is reduced too.
  g = forward("elementwise_add", {2, 2}, {{{12, 6}, "S(0),P(sum)"}, {{12, 6}, "R,S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),R", "S(0),R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),R"}));
}

TEST(BinaryRules, MultiplyPartial) {
  Got g = forward("elementwise_multiply", {2}, {{{12, 6}, "P(sum)"}, {{6}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"P(sum)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(sum)"}));
  g = forward("elementwise_multiply", {2}, {{{5, 1}, "R"}, {{1, 7}, "P(avg)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "P(avg)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(avg)"}));
  // Both Partial: x keeps it, y is reduced (P x P is not exact, P x R is).
  g = forward("elementwise_multiply", {2}, {{{12, 6}, "P(sum)"}, {{12, 6}, "P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"P(sum)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(sum)"}));
  g = forward("elementwise_multiply", {2}, {{{12, 6}, "P(max)"}, {{12, 6}, "P(avg)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "P(avg)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(avg)"}));
  // One Partial per mesh dim from different inputs: bilinear, exact.
  g = forward("elementwise_multiply", {2, 3}, {{{12, 6}, "P(sum),R"}, {{12, 6}, "R,P(avg)"}});
  EXPECT_EQ(g.inputs, (Strs{"P(sum),R", "R,P(avg)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(sum),P(avg)"}));
  g = forward("elementwise_multiply", {2}, {{{12, 6}, "P(min)"}, {{12, 6}, "R"}});
  EXPECT_EQ(g.outputs, (Strs{"R"}));
}

TEST(BinaryRules, DividePartial) {
  Got g = forward("elementwise_divide", {2}, {{{12, 6}, "P(sum)"}, {{6}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"P(sum)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(sum)"}));
  g = forward("elementwise_divide", {2}, {{{12, 6}, "R"}, {{12, 6}, "P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"R"}));
  g = forward("elementwise_divide", {2}, {{{12, 6}, "P(avg)"}, {{12, 6}, "P(avg)"}});
  EXPECT_EQ(g.inputs, (Strs{"P(avg)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(avg)"}));
  g = forward("elementwise_divide", {2}, {{{12, 6}, "P(max)"}, {{12, 6}, "R"}});
  EXPECT_EQ(g.outputs, (Strs{"R"}));
}

TEST(BinaryRules, MaxMinPartial) {
  Got g = forward("elementwise_max", {2}, {{{12, 6}, "P(max)"}, {{12, 6}, "P(max)"}});
  EXPECT_EQ(g.inputs, (Strs{"P(max)", "P(max)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(max)"}));
  g = forward("elementwise_max", {2}, {{{12, 6}, "R"}, {{6}, "P(max)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "P(max)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(max)"}));
  g = forward("elementwise_max", {2}, {{{12, 6}, "P(max)"}, {{12, 6}, "P(min)"}});
  EXPECT_EQ(g.inputs, (Strs{"P(max)", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(max)"}));
  for (const char* x : {"P(sum)", "P(avg)", "P(min)"}) {
    g = forward("elementwise_max", {2}, {{{12, 6}, x}, {{12, 6}, "R"}});
    EXPECT_EQ(g.inputs, (Strs{"R", "R"})) << x;
    EXPECT_EQ(g.outputs, (Strs{"R"})) << x;
  }
  g = forward("elementwise_min", {2, 2}, {{{12, 6}, "P(min),P(max)"}, {{12, 6}, "R,R"}});
  EXPECT_EQ(g.inputs, (Strs{"P(min),R", "R,R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(min),R"}));
}

TEST(BinaryRules, OtherBinaryOpsReplicatePartials) {
  for (const char* p : {"P(sum)", "P(avg)", "P(max)", "P(min)"}) {
    Got g = forward("elementwise_binary", {2}, {{{12, 6}, p}, {{12, 6}, p}});
    EXPECT_EQ(g.inputs, (Strs{"R", "R"})) << p;
    EXPECT_EQ(g.outputs, (Strs{"R"})) << p;
  }
  Got g = forward("elementwise_binary", {2, 3}, {{{12, 6}, "P(sum),S(1)"}, {{12, 6}, "S(0),R"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),S(1)", "S(0),S(1)"}));
}

Got forward_where(const Shape& mesh_shape, std::vector<std::pair<Shape, const char*>> ins) {
  ProcessMesh mesh(mesh_shape);
  std::vector<TensorSpec> specs;
  for (size_t k = 0; k < ins.size(); ++k) {
    specs.push_back(spec(ins[k].first, ins[k].second, mesh.ndim(), k == 0 ? DType::Bool : DType::F64));
  }
  return strings(rules().get("elementwise_where").forward(mesh, specs, {}));
}

TEST(BinaryRules, Where) {
  // cond is never Partial; x and y with the same Partial keep it.
  Got g = forward_where({2}, {{{12, 6}, "P(max)"}, {{12, 6}, "P(sum)"}, {{12, 6}, "P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "P(sum)", "P(sum)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(sum)"}));
  // P(max) with R: kept (selection is monotone); P(sum) with R: not exact.
  g = forward_where({2}, {{{12, 6}, "R"}, {{12, 6}, "R"}, {{6}, "P(max)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "R", "P(max)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(max)"}));
  g = forward_where({2}, {{{12, 6}, "R"}, {{12, 6}, "P(sum)"}, {{12, 6}, "R"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "R", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"R"}));
  // Sharding from cond; broadcast dims of x and y stay R.
  g = forward_where({2, 3}, {{{12, 6}, "S(0),S(1)"}, {{12, 1}, "R,R"}, {{6}, "R,R"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),S(1)", "S(0),R", "R,S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),S(1)"}));
}

TEST(BinaryRules, Reverse) {
  ProcessMesh mesh(Shape{2, 2});
  auto reverse = [&](const char* rule, std::vector<TensorSpec> ins, const Shape& out, const char* want) {
    std::vector<TensorSpec> outs = {spec(out, want, 2)};
    return strings(rules().get(rule).reverse(mesh, ins, outs, {}));
  };
  std::vector<TensorSpec> ins = {spec({12, 6}, "R,R", 2), spec({6}, "R,R", 2)};
  Got g = reverse("elementwise_add", ins, {12, 6}, "S(0),P(sum)");
  EXPECT_EQ(g.inputs, (Strs{"S(0),P(sum)", "R,P(sum)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),P(sum)"}));
  g = reverse("elementwise_add", ins, {12, 6}, "S(1),S(0)");
  EXPECT_EQ(g.inputs, (Strs{"S(1),S(0)", "S(0),R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(1),S(0)"}));
  g = reverse("elementwise_multiply", ins, {12, 6}, "P(avg),S(1)");
  EXPECT_EQ(g.inputs, (Strs{"P(avg),S(1)", "R,S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(avg),S(1)"}));
  g = reverse("elementwise_max", ins, {12, 6}, "P(max),P(min)");
  EXPECT_EQ(g.inputs, (Strs{"P(max),R", "P(max),R"}));
  EXPECT_EQ(g.outputs, (Strs{"P(max),R"}));
  g = reverse("elementwise_binary", ins, {12, 6}, "P(sum),S(0)");
  EXPECT_EQ(g.inputs, (Strs{"R,S(0)", "R,R"}));
  EXPECT_EQ(g.outputs, (Strs{"R,S(0)"}));
  // Broadcast dims stay R.
  std::vector<TensorSpec> outer = {spec({5, 1}, "R,R", 2), spec({1, 7}, "R,R", 2)};
  g = reverse("elementwise_divide", outer, {5, 7}, "S(1),S(0)");
  EXPECT_EQ(g.inputs, (Strs{"R,S(0)", "S(1),R"}));
  EXPECT_EQ(g.outputs, (Strs{"S(1),S(0)"}));
  EXPECT_THROW(reverse("elementwise_add", ins, {12, 7}, "R,R"), Error);
}

Got grad(const char* rule, const Shape& mesh_shape, std::vector<std::pair<Shape, const char*>> ins,
         DType first = DType::F64) {
  ProcessMesh mesh(mesh_shape);
  std::vector<TensorSpec> specs;
  for (size_t k = 0; k < ins.size(); ++k) {
    specs.push_back(spec(ins[k].first, ins[k].second, mesh.ndim(), k == 0 ? first : DType::F64));
  }
  return strings(rules().get(rule).grad(mesh, specs, {}));
}

TEST(BinaryRules, GradBroadcastDimsArePartialSum) {
  // x 12x6 S(0), y 6: dy sums over the sharded dim 0 -> P(sum).
  Got g = grad("elementwise_add", {2}, {{{12, 6}, "S(0)"}, {{6}, "R"}, {{12, 6}, "S(0)"}, {{12, 6}, "S(0)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "R", "S(0)", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)", "P(sum)"}));
  // 5x1 with 1x7 on [2,2], output sharded on both dims.
  g = grad("elementwise_multiply", {2, 2},
           {{{5, 1}, "S(0),R"}, {{1, 7}, "R,S(1)"}, {{5, 7}, "S(0),S(1)"}, {{5, 7}, "S(0),S(1)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),R", "R,S(1)", "S(0),S(1)", "S(0),S(1)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),P(sum)", "P(sum),S(1)"}));
  // Sharding that comes from dout alone.
  g = grad("elementwise_max", {2}, {{{12, 6}, "R"}, {{12, 6}, "R"}, {{12, 6}, "R"}, {{12, 6}, "S(1)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(1)", "S(1)", "S(1)", "S(1)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(1)", "S(1)"}));
}

TEST(BinaryRules, GradDoutPartialPassesWhenLinear) {
  Got g = grad("elementwise_multiply", {2}, {{{12, 6}, "R"}, {{6}, "R"}, {{12, 6}, "R"}, {{12, 6}, "P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "R", "R", "P(sum)"}));
  EXPECT_EQ(g.outputs, (Strs{"P(sum)", "P(sum)"}));
  g = grad("elementwise_binary", {2, 2},
           {{{12, 6}, "S(0),R"}, {{12, 6}, "R,R"}, {{12, 6}, "R,R"}, {{12, 6}, "R,P(avg)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0),R", "S(0),R", "S(0),R", "S(0),P(avg)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0),P(avg)", "S(0),P(avg)"}));
  // dout P(max) is not linear-compatible; x's own Partial is reduced.
  g = grad("elementwise_add", {2}, {{{12, 6}, "P(sum)"}, {{12, 6}, "R"}, {{12, 6}, "R"}, {{12, 6}, "P(max)"}});
  EXPECT_EQ(g.inputs, (Strs{"R", "R", "R", "R"}));
  EXPECT_EQ(g.outputs, (Strs{"R", "R"}));
  // A dout Partial on a mesh dim that shards an axis loses to the sharding.
  g = grad("elementwise_add", {2}, {{{12, 6}, "S(0)"}, {{12, 6}, "R"}, {{12, 6}, "R"}, {{12, 6}, "P(sum)"}});
  EXPECT_EQ(g.inputs, (Strs{"S(0)", "S(0)", "S(0)", "S(0)"}));
  EXPECT_EQ(g.outputs, (Strs{"S(0)", "S(0)"}));
}

TEST(BinaryRules, GradWhere) {
  Got g = grad("elementwise_where", {2, 2},
               {{{12, 6}, "S(0),R"}, {{6}, "R,R"}, {{12, 1}, "R,R"}, {{12, 6}, "R,S(1)"}, {{12, 6}, "R,P(sum)"}},
               DType::Bool);
  EXPECT_EQ(g.inputs, (Strs{"S(0),S(1)", "R,S(0)", "S(0),R", "S(0),S(1)", "S(0),S(1)"}));
  // cond: no gradient (R); x lacks dim 0 (sharded by mesh dim 0); y broadcasts dim 1 (mesh dim 1).
  EXPECT_EQ(g.outputs, (Strs{"R,R", "P(sum),S(0)", "S(0),P(sum)"}));
}

TEST(BinaryRules, Errors) {
  ProcessMesh mesh(Shape{2});
  const Rule& add = rules().get("elementwise_add");
  std::vector<TensorSpec> bad = {spec({12, 6}, "R", 1), spec({5}, "R", 1)};
  try {
    add.forward(mesh, bad, {});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("12x6"), std::string::npos) << msg;
    EXPECT_NE(msg.find(" 5 "), std::string::npos) << msg;
  }
  std::vector<TensorSpec> one = {spec({12, 6}, "R", 1)};
  EXPECT_THROW(add.forward(mesh, one, {}), Error);
  std::vector<TensorSpec> rank = {spec({12, 6}, "R", 1), spec({6}, "S(1)", 1)};
  EXPECT_THROW(add.forward(mesh, rank, {}), Error);
  // grad with an out of the wrong shape.
  std::vector<TensorSpec> g = {spec({12, 6}, "R", 1), spec({6}, "R", 1), spec({6}, "R", 1), spec({12, 6}, "R", 1)};
  EXPECT_THROW(add.grad(mesh, g, {}), Error);
}

}  // namespace
}  // namespace shardwise::spmd
