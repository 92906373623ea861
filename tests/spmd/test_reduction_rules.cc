// Reduction rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

ProcessMesh mesh_of(Shape s) { return ProcessMesh(s); }

Attrs axes(std::vector<int64_t> a, bool keepdim = false) {
  Attrs attrs;
  attrs.set("axis", std::move(a));
  attrs.set("keepdim", keepdim);
  return attrs;
}

// Forward: returns "required x | output".
std::string fwd(std::string_view rule, const ProcessMesh& mesh, Shape shape, std::string_view dist, const Attrs& attrs,
                DType dtype = DType::F64) {
  std::vector<TensorSpec> in = {{shape, dtype, parse_dist(dist, mesh.ndim())}};
  SpmdResult r = rules().get(rule).forward(mesh, in, attrs);
  EXPECT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return r.inputs[0].to_string() + " | " + r.outputs[0].to_string();
}

// Reverse from a wanted output (x's advisory distribution given).
std::string rev(std::string_view rule, const ProcessMesh& mesh, Shape shape, std::string_view x_dist,
                Shape out_shape, std::string_view want, const Attrs& attrs) {
  std::vector<TensorSpec> in = {{shape, DType::F64, parse_dist(x_dist, mesh.ndim())}};
  std::vector<TensorSpec> out = {{out_shape, DType::F64, parse_dist(want, mesh.ndim())}};
  SpmdResult r = rules().get(rule).reverse(mesh, in, out, attrs);
  return r.inputs[0].to_string() + " | " + r.outputs[0].to_string();
}

// Grad: returns "x | out | dout -> dx".
std::string grad(std::string_view rule, const ProcessMesh& mesh, Shape shape, std::string_view x, Shape out_shape,
                 std::string_view out, std::string_view dout, const Attrs& attrs, DType dtype = DType::F64) {
  std::vector<TensorSpec> in = {{shape, dtype, parse_dist(x, mesh.ndim())},
                                {out_shape, dtype, parse_dist(out, mesh.ndim())},
                                {out_shape, dtype, parse_dist(dout, mesh.ndim())}};
  SpmdResult r = rules().get(rule).grad(mesh, in, attrs);
  EXPECT_EQ(r.inputs.size(), 3u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return r.inputs[0].to_string() + " | " + r.inputs[1].to_string() + " | " + r.inputs[2].to_string() + " -> " +
         r.outputs[0].to_string();
}

TEST(ReductionRules, AllRegisteredWithSummaries) {
  for (const char* name :
       {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_amax", "reduce_amin", "reduce_prod"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "reduction");
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(ReductionRules, SumShardedReducedAxisBecomesPartialAndKeptDimsRenumber) {
  ProcessMesh m = mesh_of({2, 2});
  EXPECT_EQ(fwd("reduce_sum", m, {4, 6}, "S(0),S(1)", axes({0})), "S(0),S(1) | P(sum),S(0)");
  EXPECT_EQ(fwd("reduce_sum", m, {4, 6}, "S(0),S(1)", axes({0}, true)), "S(0),S(1) | P(sum),S(1)");
  EXPECT_EQ(fwd("reduce_sum", m, {4, 6}, "S(0),S(1)", Attrs{}), "S(0),S(1) | P(sum),P(sum)");
  // Uneven and empty shards stay: empty shards add 0.
  EXPECT_EQ(fwd("reduce_sum", mesh_of({3}), {2, 5}, "S(0)", axes({0})), "S(0) | P(sum)");
  // Partial inputs: sum and avg pass through, max/min are resharded.
  EXPECT_EQ(fwd("reduce_sum", m, {4, 6}, "P(avg),S(1)", axes({1})), "P(avg),S(1) | P(avg),P(sum)");
  EXPECT_EQ(fwd("reduce_sum", m, {4, 6}, "P(sum),P(max)", axes({1})), "P(sum),R | P(sum),R");
  // Co-sharded kept dim keeps its order.
  EXPECT_EQ(fwd("reduce_sum", m, {4, 6}, "S(1)@1,S(1)@0", axes({0})), "S(1)@1,S(1)@0 | S(0)@1,S(0)@0");
}

TEST(ReductionRules, MeanKeepsOnlyEqualChunks) {
  EXPECT_EQ(fwd("reduce_mean", mesh_of({2}), {12, 6}, "S(0)", axes({0})), "S(0) | P(avg)");
  EXPECT_EQ(fwd("reduce_mean", mesh_of({2}), {5, 7}, "S(0)", axes({0})), "R | R");
  EXPECT_EQ(fwd("reduce_mean", mesh_of({3}), {2, 5}, "S(0)", axes({0})), "R | R");  // empty chunk
  ProcessMesh m = mesh_of({2, 3});
  EXPECT_EQ(fwd("reduce_mean", m, {12, 1}, "S(0),S(0)", axes({0})), "S(0),S(0) | P(avg),P(avg)");
  // 4 splits evenly in 2 but not in 6: the second mesh dim is dropped.
  EXPECT_EQ(fwd("reduce_mean", m, {4, 3}, "S(0),S(0)", axes({0})), "S(0),R | P(avg),R");
  // 3 does not split in 2, but does in 3: keep the later mesh dim.
  EXPECT_EQ(fwd("reduce_mean", m, {3, 4}, "S(0),S(0)", axes({0})), "R,S(0) | R,P(avg)");
  // Two reduced axes, each checked on its own; kept dims shard unevenly without harm.
  EXPECT_EQ(fwd("reduce_mean", m, {4, 3, 5}, "S(0),S(2)", axes({0, 2})), "S(0),R | P(avg),R");
  EXPECT_EQ(fwd("reduce_mean", m, {5, 3}, "S(0),S(1)", axes({1})), "S(0),S(1) | S(0),P(avg)");
  EXPECT_EQ(fwd("reduce_mean", m, {4, 6}, "P(sum),P(avg)", axes({1})), "P(sum),P(avg) | P(sum),P(avg)");
  EXPECT_EQ(fwd("reduce_mean", m, {4, 6}, "P(min),S(1)", axes({1})), "R,S(1) | R,P(avg)");
}

TEST(ReductionRules, ExtremaAndProd) {
  ProcessMesh m = mesh_of({2});
  EXPECT_EQ(fwd("reduce_max", m, {4, 6}, "S(1)", axes({1})), "S(1) | P(max)");
  EXPECT_EQ(fwd("reduce_amax", m, {4, 6}, "S(1)", axes({1})), "S(1) | P(max)");
  EXPECT_EQ(fwd("reduce_min", m, {4, 6}, "S(1)", axes({1})), "S(1) | P(min)");
  EXPECT_EQ(fwd("reduce_amin", m, {4, 6}, "S(1)", axes({-1})), "S(1) | P(min)");
  EXPECT_EQ(fwd("reduce_max", m, {4, 6}, "P(max)", axes({1})), "P(max) | P(max)");
  EXPECT_EQ(fwd("reduce_max", m, {4, 6}, "P(sum)", axes({1})), "R | R");
  EXPECT_EQ(fwd("reduce_max", m, {4, 6}, "P(min)", axes({1})), "R | R");
  EXPECT_EQ(fwd("reduce_min", m, {4, 6}, "P(min)", axes({1})), "P(min) | P(min)");
  EXPECT_EQ(fwd("reduce_amin", m, {4, 6}, "P(max)", axes({1})), "R | R");
  EXPECT_EQ(fwd("reduce_max", m, {4, 6}, "S(0)", axes({1})), "S(0) | S(0)");
  ProcessMesh m2 = mesh_of({2, 2});
  EXPECT_EQ(fwd("reduce_max", m2, {4, 6}, "P(max),S(1)", axes({1})), "P(max),S(1) | P(max),P(max)");
  EXPECT_EQ(fwd("reduce_prod", m2, {4, 6}, "S(0),S(1)", axes({1})), "S(0),R | S(0),R");
  EXPECT_EQ(fwd("reduce_prod", m2, {4, 6}, "P(sum),S(0)", axes({1})), "R,S(0) | R,S(0)");
  EXPECT_EQ(fwd("reduce_prod", m2, {4, 6}, "P(max),P(min)", Attrs{}), "R,R | R,R");
}

TEST(ReductionRules, ForwardRejectsBadAxes) {
  ProcessMesh m = mesh_of({2});
  EXPECT_THROW(fwd("reduce_sum", m, {4, 6}, "R", axes({1, -1})), Error);
  EXPECT_THROW(fwd("reduce_sum", m, {4, 6}, "R", axes({2})), Error);
  std::vector<TensorSpec> two(2, TensorSpec{Shape{4}, DType::F64, DistAttr(1)});
  EXPECT_THROW(rules().get("reduce_sum").forward(m, two, Attrs{}), Error);
}

TEST(ReductionRules, ReverseFromWantedOutput) {
  ProcessMesh m = mesh_of({2});
  EXPECT_EQ(rev("reduce_sum", m, {12, 6}, "R", {12}, "P(sum)", axes({1})), "S(1) | P(sum)");
  EXPECT_EQ(rev("reduce_sum", m, {12, 6}, "R", {12}, "S(0)", axes({1})), "S(0) | S(0)");
  EXPECT_EQ(rev("reduce_sum", m, {12, 6}, "R", {12}, "P(avg)", axes({1})), "P(avg) | P(avg)");
  EXPECT_EQ(rev("reduce_sum", m, {12, 6}, "R", {12}, "P(max)", axes({1})), "R | R");
  EXPECT_EQ(rev("reduce_prod", m, {12, 6}, "R", {12}, "P(sum)", axes({1})), "R | R");
  EXPECT_EQ(rev("reduce_max", m, {12, 6}, "R", {12}, "P(max)", axes({1})), "S(1) | P(max)");
  EXPECT_EQ(rev("reduce_min", m, {12, 6}, "R", {12}, "P(max)", axes({1})), "R | R");
  // Mean: an uneven axis cannot give P(avg) by sharding, a P(avg) input can.
  EXPECT_EQ(rev("reduce_mean", m, {5, 7}, "R", {7}, "P(avg)", axes({0})), "P(avg) | P(avg)");
  EXPECT_EQ(rev("reduce_mean", m, {12, 7}, "R", {7}, "P(avg)", axes({0})), "S(0) | P(avg)");
  EXPECT_EQ(rev("reduce_mean", m, {12, 7}, "R", {7}, "P(sum)", axes({0})), "P(sum) | P(sum)");
  ProcessMesh m23 = mesh_of({2, 3});
  EXPECT_EQ(rev("reduce_mean", m23, {12, 6}, "R,R", {6}, "P(avg),P(avg)", axes({0})),
            "S(0),S(0) | P(avg),P(avg)");
  EXPECT_EQ(rev("reduce_mean", m23, {4, 6}, "R,R", {6}, "P(avg),P(avg)", axes({0})), "S(0),P(avg) | P(avg),P(avg)");
  EXPECT_EQ(rev("reduce_sum", m23, {4, 6}, "R,R", {4}, "S(0),P(sum)", axes({1})), "S(0),S(1) | S(0),P(sum)");
  // The advisory input picks which reduced axis to shard; otherwise the first one.
  EXPECT_EQ(rev("reduce_sum", m, {4, 6, 5}, "S(2)", {6}, "P(sum)", axes({0, 2})), "S(2) | P(sum)");
  EXPECT_EQ(rev("reduce_sum", m, {4, 6, 5}, "S(1)", {6}, "P(sum)", axes({0, 2})), "S(0) | P(sum)");
  // keepdim: a size-1 reduced dim cannot be sharded.
  EXPECT_EQ(rev("reduce_sum", m, {12, 6}, "R", {1, 6}, "S(0)", axes({0}, true)), "R | R");
  EXPECT_EQ(rev("reduce_sum", m, {12, 6}, "R", {1, 6}, "S(1)", axes({0}, true)), "S(1) | S(1)");
  EXPECT_THROW(rev("reduce_sum", m, {12, 6}, "R", {12, 6}, "R", axes({1})), Error);
}

TEST(ReductionRules, GradSumAndMean) {
  ProcessMesh m = mesh_of({2});
  Attrs a0 = axes({0});
  // Sum: a sharded reduced axis of x stays; out is not read and keeps its layout.
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "S(0)", {6}, "P(sum)", "R", a0), "S(0) | P(sum) | R -> S(0)");
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "R", {6}, "R", "P(sum)", a0), "R | R | P(sum) -> P(sum)");
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "R", {6}, "R", "P(avg)", a0), "R | R | P(avg) -> P(avg)");
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "R", {6}, "R", "P(max)", a0), "R | R | R -> R");
  // x shards first and wins the mesh dim; dout is gathered.
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "S(0)", {6}, "R", "P(sum)", a0), "S(0) | R | R -> S(0)");
  // x's values are not read: its Partial stays.
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "P(max)", {6}, "R", "R", a0), "P(max) | R | R -> R");
  // Mean: the local count must be global, so x's reduced axes are gathered.
  EXPECT_EQ(grad("reduce_mean", m, {12, 6}, "S(0)", {6}, "P(avg)", "R", a0), "R | P(avg) | R -> R");
  EXPECT_EQ(grad("reduce_mean", m, {12, 6}, "S(1)", {6}, "R", "S(0)", a0), "S(1) | R | S(0) -> S(1)");
  EXPECT_EQ(grad("reduce_mean", m, {12, 6}, "R", {6}, "R", "P(sum)", a0), "R | R | P(sum) -> P(sum)");
  // keepdim: dout's size-1 dim is never sharded.
  EXPECT_EQ(grad("reduce_sum", m, {12, 6}, "R", {1, 6}, "R", "S(0)", axes({0}, true)), "R | R | R -> R");
}

TEST(ReductionRules, GradExtremaAndProd) {
  ProcessMesh m = mesh_of({2});
  Attrs a0 = axes({0});
  // max/min: x may stay sharded on the reduced axis, out must be the global extremum.
  EXPECT_EQ(grad("reduce_max", m, {12, 6}, "S(0)", {6}, "P(max)", "R", a0), "S(0) | R | R -> S(0)");
  EXPECT_EQ(grad("reduce_min", m, {12, 6}, "S(1)", {6}, "S(0)", "R", a0), "S(1) | S(0) | S(0) -> S(1)");
  EXPECT_EQ(grad("reduce_max", m, {12, 6}, "P(sum)", {6}, "R", "P(sum)", a0), "R | R | P(sum) -> P(sum)");
  // amax/amin: the tie count spans the whole reduced extent.
  EXPECT_EQ(grad("reduce_amax", m, {12, 6}, "S(0)", {6}, "P(max)", "R", a0), "R | R | R -> R");
  EXPECT_EQ(grad("reduce_amin", m, {12, 6}, "R", {6}, "R", "P(avg)", a0), "R | R | P(avg) -> P(avg)");
  // Integer amax divides with truncation: not linear, so dout is gathered.
  EXPECT_EQ(grad("reduce_amax", m, {12, 6}, "R", {6}, "R", "P(sum)", a0, DType::I64), "R | R | R -> R");
  EXPECT_EQ(grad("reduce_max", m, {12, 6}, "R", {6}, "R", "P(sum)", a0, DType::I64), "R | R | P(sum) -> P(sum)");
  // prod: reduced axes and Partials of x gathered; out not read.
  EXPECT_EQ(grad("reduce_prod", m, {12, 6}, "S(0)", {6}, "R", "R", a0), "R | R | R -> R");
  EXPECT_EQ(grad("reduce_prod", m, {12, 6}, "P(sum)", {6}, "S(0)", "R", a0), "R | S(0) | R -> R");
  EXPECT_EQ(grad("reduce_prod", m, {12, 6}, "S(1)", {6}, "R", "R", a0), "S(1) | R | S(0) -> S(1)");
  ProcessMesh m2 = mesh_of({2, 2});
  EXPECT_EQ(grad("reduce_max", m2, {4, 6}, "S(0),S(1)", {6}, "P(max),S(0)", "R,R", a0),
            "S(0),S(1) | R,S(0) | R,S(0) -> S(0),S(1)");
}

}  // namespace
}  // namespace shardwise::spmd
