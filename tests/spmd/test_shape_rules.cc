// Shape-op rules against hand-derived expectations (forward, reverse, grad), including the
// reshape rule's hard cases from the issue.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

struct In {
  Shape shape;
  const char* dist;
};

std::vector<TensorSpec> specs(const ProcessMesh& mesh, const std::vector<In>& ins, DType dtype = DType::F64) {
  std::vector<TensorSpec> out;
  for (const In& in : ins) out.push_back({in.shape, dtype, parse_dist(in.dist, mesh.ndim())});
  return out;
}

std::string join(const std::vector<DistAttr>& dists) {
  std::string s;
  for (const DistAttr& d : dists) s += (s.empty() ? "" : "; ") + d.to_string();
  return s;
}

std::string show(const SpmdResult& r) { return join(r.inputs) + " | " + join(r.outputs); }

// "required inputs | outputs"
std::string fwd(std::string_view rule, Shape mesh_shape, const std::vector<In>& ins, const Attrs& attrs) {
  ProcessMesh mesh(mesh_shape);
  return show(rules().get(rule).forward(mesh, specs(mesh, ins), attrs));
}

// Reverse from wanted outputs (inputs Replicate, advisory).
std::string rev(std::string_view rule, Shape mesh_shape, const std::vector<Shape>& in_shapes,
                const std::vector<In>& outs, const Attrs& attrs) {
  ProcessMesh mesh(mesh_shape);
  std::vector<TensorSpec> in_specs;
  for (const Shape& s : in_shapes) in_specs.push_back({s, DType::F64, DistAttr(mesh.ndim())});
  return show(rules().get(rule).reverse(mesh, in_specs, specs(mesh, outs), attrs));
}

// Grad: tensors = inputs ++ outputs ++ output grads; "required | input grads".
std::string grad(std::string_view rule, Shape mesh_shape, const std::vector<In>& tensors, const Attrs& attrs) {
  ProcessMesh mesh(mesh_shape);
  return show(rules().get(rule).grad(mesh, specs(mesh, tensors), attrs));
}

Attrs shape_attr(std::vector<int64_t> s) { return Attrs{{"shape", std::move(s)}}; }

TEST(ShapeRules, AllRegisteredWithSummaries) {
  for (const char* name : {"reshape", "squeeze", "unsqueeze", "flatten", "transpose", "expand", "concat", "split",
                           "slice", "stack", "tile"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "shape");
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(ShapeRules, ReshapeSplitMovesShardingToTheFirstPieceWhenItDivides) {
  // [1,512,4096] -> [1,2,256,4096]: 512 splits into (2, 256). The '2' divides mesh 2: S moves there.
  Attrs split = shape_attr({1, 2, 256, 4096});
  EXPECT_EQ(fwd("reshape", {2}, {{{1, 512, 4096}, "S(1)"}}, split), "S(1) | S(1)");
  // On mesh 3 the piece 2 does not divide: Replicate.
  EXPECT_EQ(fwd("reshape", {3}, {{{1, 512, 4096}, "S(1)"}}, split), "R | R");
  // 4096 maps 1:1 (to dim 3); the size-1 dim pairs 1:1 too.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{1, 512, 4096}, "S(2),S(1)"}}, split), "S(2),S(1) | S(3),S(1)");
  // Co-sharded 24 -> (2, 12): mesh dim 0 (2) is kept, mesh dim 1 would need 2 % 4.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{24}, "S(0),S(0)"}}, shape_attr({2, 12})), "S(0),R | S(0),R");
  // 12 -> (3, 4) keeps on mesh 3, not on mesh 2.
  EXPECT_EQ(fwd("reshape", {3}, {{{12, 6}, "S(0)"}}, shape_attr({3, 4, 6})), "S(0) | S(0)");
  EXPECT_EQ(fwd("reshape", {2}, {{{12, 6}, "S(0)"}}, shape_attr({3, 4, 6})), "R | R");
  // A 1:1 dim keeps uneven sharding: 5 stays 5.
  EXPECT_EQ(fwd("reshape", {2}, {{{5, 12}, "S(0)"}}, shape_attr({5, 3, 4})), "S(0) | S(0)");
}

TEST(ShapeRules, ReshapeFlattenKeepsLeftmostEvenSharding) {
  EXPECT_EQ(fwd("reshape", {2}, {{{12, 6}, "S(0)"}}, shape_attr({72})), "S(0) | S(0)");
  // Uneven leftmost dim: chunk boundaries do not line up -> Replicate.
  EXPECT_EQ(fwd("reshape", {2}, {{{5, 7}, "S(0)"}}, shape_attr({35})), "R | R");
  // Non-leftmost flattened dim: Replicate.
  EXPECT_EQ(fwd("reshape", {2}, {{{12, 6}, "S(1)"}}, shape_attr({72})), "R | R");
  // A regroup 6x4 -> 4x6: both leftmost extents divide 2, not 3 (4 % 3).
  EXPECT_EQ(fwd("reshape", {2}, {{{6, 4}, "S(0)"}}, shape_attr({4, 6})), "S(0) | S(0)");
  EXPECT_EQ(fwd("reshape", {3}, {{{6, 4}, "S(0)"}}, shape_attr({4, 6})), "R | R");
  // A size-1 dim that disappears carries no sharding.
  EXPECT_EQ(fwd("reshape", {2}, {{{1, 12}, "S(0)"}}, shape_attr({12})), "R | R");
  EXPECT_EQ(fwd("reshape", {2}, {{{1, 12}, "S(1)"}}, shape_attr({12})), "S(1) | S(0)");
}

TEST(ShapeRules, ReshapePartialPassesAndReverseAndGrad) {
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{12, 6}, "P(max),S(1)"}}, shape_attr({72})), "P(max),R | P(max),R");
  EXPECT_EQ(fwd("reshape", {2, 3}, {{{12, 6}, "S(0),P(avg)"}}, shape_attr({72})), "S(0),P(avg) | S(0),P(avg)");
  // Reverse: the wanted flatten sharding goes back to the leftmost dim.
  EXPECT_EQ(rev("reshape", {2}, {{12, 6}}, {{{72}, "S(0)"}}, shape_attr({72})), "S(0) | S(0)");
  EXPECT_EQ(rev("reshape", {2}, {{5, 7}}, {{{35}, "S(0)"}}, shape_attr({35})), "R | R");
  EXPECT_EQ(rev("reshape", {2, 2}, {{12, 6}}, {{{3, 4, 6}, "S(2),P(sum)"}}, shape_attr({3, 4, 6})),
            "S(1),P(sum) | S(2),P(sum)");
  EXPECT_EQ(rev("reshape", {3}, {{1, 512, 4096}}, {{{1, 2, 256, 4096}, "S(1)"}}, shape_attr({1, 2, 256, 4096})),
            "R | R");
  // Grad: dout [72] S(0) goes back to dx S(0); x and out keep their distributions.
  EXPECT_EQ(grad("reshape", {2, 2}, {{{12, 6}, "S(1),R"}, {{72}, "R,R"}, {{72}, "S(0),P(sum)"}}, shape_attr({72})),
            "S(1),R; R,R; S(0),P(sum) | S(0),P(sum)");
  EXPECT_EQ(grad("reshape", {2}, {{{5, 7}, "R"}, {{35}, "R"}, {{35}, "S(0)"}}, shape_attr({35})), "R; R; R | R");
  EXPECT_THROW(grad("reshape", {2}, {{{5, 7}, "R"}, {{35}, "R"}}, shape_attr({35})), Error);
}

TEST(ShapeRules, SqueezeUnsqueezeFlattenRenumber) {
  Attrs all_ones{{"axis", std::vector<int64_t>{}}};
  EXPECT_EQ(fwd("squeeze", {2, 3}, {{{1, 12, 1}, "S(1),P(min)"}}, all_ones), "S(1),P(min) | S(0),P(min)");
  // A "sharded" extent-1 dim that is squeezed away must be Replicate.
  EXPECT_EQ(fwd("squeeze", {2}, {{{5, 1, 7}, "S(1)"}}, Attrs{{"axis", std::vector<int64_t>{1}}}), "R | R");
  EXPECT_EQ(fwd("squeeze", {2}, {{{5, 1, 7}, "S(2)"}}, Attrs{{"axis", std::vector<int64_t>{1}}}), "S(2) | S(1)");
  EXPECT_EQ(fwd("unsqueeze", {2, 2}, {{{5, 7}, "S(1),S(0)"}}, Attrs{{"axis", std::vector<int64_t>{1, 3}}}),
            "S(1),S(0) | S(2),S(0)");
  Attrs mid{{"start_axis", int64_t{1}}, {"stop_axis", int64_t{2}}};
  EXPECT_EQ(fwd("flatten", {3}, {{{2, 6, 5}, "S(1)"}}, mid), "S(1) | S(1)");
  EXPECT_EQ(fwd("flatten", {3}, {{{2, 6, 5}, "S(2)"}}, mid), "R | R");
  EXPECT_EQ(fwd("flatten", {3}, {{{2, 6, 5}, "S(0)"}}, mid), "S(0) | S(0)");  // 1:1, uneven kept
  EXPECT_EQ(grad("flatten", {2}, {{{2, 6, 5}, "R"}, {{2, 30}, "R"}, {{2, 30}, "S(1)"}}, mid), "R; R; S(1) | S(1)");
}

TEST(ShapeRules, TransposeFollowsThePermutation) {
  Attrs perm{{"perm", std::vector<int64_t>{2, 0, 1}}};
  EXPECT_EQ(fwd("transpose", {2, 2}, {{{4, 6, 8}, "S(0),S(2)"}}, perm), "S(0),S(2) | S(1),S(0)");
  EXPECT_EQ(fwd("transpose", {2, 2}, {{{4, 6, 8}, "S(0)@1,S(0)@0"}}, perm), "S(0)@1,S(0)@0 | S(1)@1,S(1)@0");
  EXPECT_EQ(fwd("transpose", {2}, {{{4, 6, 8}, "P(avg)"}}, perm), "P(avg) | P(avg)");
  EXPECT_EQ(rev("transpose", {2, 2}, {{4, 6, 8}}, {{{8, 4, 6}, "S(0),P(sum)"}}, perm), "S(2),P(sum) | S(0),P(sum)");
  EXPECT_EQ(grad("transpose", {2, 2}, {{{4, 6, 8}, "R,R"}, {{8, 4, 6}, "R,R"}, {{8, 4, 6}, "S(0),P(sum)"}}, perm),
            "R,R; R,R; S(0),P(sum) | S(2),P(sum)");
}

TEST(ShapeRules, ExpandReplicatesBroadcastDims) {
  EXPECT_EQ(fwd("expand", {2}, {{{5, 1}, "S(0)"}}, shape_attr({5, 7})), "S(0) | S(0)");
  EXPECT_EQ(fwd("expand", {2}, {{{5, 1}, "S(1)"}}, shape_attr({5, 7})), "R | R");
  EXPECT_EQ(fwd("expand", {2, 2}, {{{3}, "S(0),P(sum)"}}, shape_attr({2, 3})), "S(0),P(sum) | S(1),P(sum)");
  // An extent-1 dim that stays 1 maps 1:1 and keeps even an empty-shard sharding.
  EXPECT_EQ(fwd("expand", {2}, {{{1, 5}, "S(0)"}}, shape_attr({1, 5})), "S(0) | S(0)");
  EXPECT_EQ(rev("expand", {2, 2}, {{1, 7}}, {{{4, 7}, "S(0),S(1)"}}, shape_attr({4, 7})), "R,S(1) | R,S(1)");
  // Grad: dout sharded on the broadcast dim -> dx P(sum) there.
  EXPECT_EQ(grad("expand", {2, 2}, {{{1, 7}, "R,R"}, {{4, 7}, "R,R"}, {{4, 7}, "S(0),S(1)"}}, shape_attr({4, 7})),
            "R,R; R,R; S(0),S(1) | P(sum),S(1)");
  // dout's P(max) cannot pass a sum, but passes when nothing is summed.
  EXPECT_EQ(grad("expand", {2}, {{{1, 7}, "R"}, {{4, 7}, "R"}, {{4, 7}, "P(max)"}}, shape_attr({4, 7})), "R; R; R | R");
  EXPECT_EQ(grad("expand", {2}, {{{1, 7}, "R"}, {{1, 7}, "R"}, {{1, 7}, "P(max)"}}, shape_attr({1, 7})),
            "R; R; P(max) | P(max)");
  EXPECT_EQ(grad("expand", {2}, {{{1, 7}, "R"}, {{4, 7}, "R"}, {{4, 7}, "P(avg)"}}, shape_attr({4, 7})),
            "R; R; P(avg) | P(avg)");
}

TEST(ShapeRules, ConcatMergesInputsAndReplicatesTheAxis) {
  Attrs axis1{{"axis", int64_t{1}}};
  // x1 shards dim 0 on mesh dim 0 and wins; x2's dim 0 sharding (mesh dim 1) loses.
  EXPECT_EQ(fwd("concat", {2, 2}, {{{4, 6}, "S(0),R"}, {{4, 3}, "R,S(0)"}}, axis1), "S(0),R; S(0),R | S(0),R");
  // The concat axis is Replicate.
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "S(1)"}, {{4, 3}, "S(0)"}}, axis1), "S(0); S(0) | S(0)");
  // The first input that shards a dim wins, whichever input it is.
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "R"}, {{4, 3}, "S(0)"}, {{4, 1}, "R"}}, axis1), "S(0); S(0); S(0) | S(0)");
  // Partial: sum/avg only when every input has it; max/min with Replicate operands.
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(sum)"}, {{4, 3}, "P(sum)"}}, axis1), "P(sum); P(sum) | P(sum)");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(sum)"}, {{4, 3}, "R"}}, axis1), "R; R | R");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(avg)"}, {{4, 3}, "P(sum)"}}, axis1), "R; R | R");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "R"}, {{4, 3}, "P(min)"}}, axis1), "R; P(min) | P(min)");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(max)"}, {{4, 3}, "P(min)"}}, axis1), "P(max); R | P(max)");
  EXPECT_THROW(fwd("concat", {2}, {{{4, 6}, "R"}, {{5, 3}, "R"}}, axis1), Error);
  EXPECT_EQ(rev("concat", {2, 2}, {{4, 6}, {4, 3}}, {{{4, 9}, "S(1),P(avg)"}}, axis1), "R,P(avg); R,P(avg) | R,P(avg)");
  EXPECT_EQ(grad("concat", {2, 2}, {{{4, 6}, "R,R"}, {{4, 3}, "R,R"}, {{4, 9}, "R,R"}, {{4, 9}, "S(1),P(max)"}}, axis1),
            "R,R; R,R; R,R; R,P(max) | R,P(max); R,P(max)");
}

TEST(ShapeRules, StackAndSplit) {
  Attrs axis0{{"axis", int64_t{0}}};
  EXPECT_EQ(fwd("stack", {2}, {{{4}, "R"}, {{4}, "S(0)"}}, axis0), "S(0); S(0) | S(1)");
  EXPECT_EQ(fwd("stack", {2}, {{{4}, "P(sum)"}, {{4}, "P(sum)"}}, Attrs{{"axis", int64_t{-1}}}),
            "P(sum); P(sum) | P(sum)");
  EXPECT_EQ(rev("stack", {2}, {{4}, {4}}, {{{2, 4}, "S(0)"}}, axis0), "R; R | R");
  EXPECT_EQ(rev("stack", {2}, {{4}, {4}}, {{{2, 4}, "S(1)"}}, axis0), "S(0); S(0) | S(1)");
  EXPECT_EQ(grad("stack", {2}, {{{4}, "R"}, {{4}, "R"}, {{2, 4}, "R"}, {{2, 4}, "S(1)"}}, axis0),
            "R; R; R; S(1) | S(0); S(0)");
  EXPECT_EQ(grad("stack", {2}, {{{4}, "R"}, {{4}, "R"}, {{2, 4}, "R"}, {{2, 4}, "S(0)"}}, axis0), "R; R; R; R | R; R");

  Attrs halves{{"axis", int64_t{0}}, {"num", int64_t{2}}};
  EXPECT_EQ(fwd("split", {2}, {{{6, 4}, "S(0)"}}, halves), "R | R; R");
  EXPECT_EQ(fwd("split", {2, 2}, {{{6, 4}, "S(1),P(min)"}}, halves), "S(1),P(min) | S(1),P(min); S(1),P(min)");
  EXPECT_EQ(rev("split", {2}, {{6, 4}}, {{{3, 4}, "S(1)"}, {{3, 4}, "R"}}, halves), "S(1) | S(1); S(1)");
  // Grad: the piece gradients merge like concat inputs (first wins), dx alike.
  EXPECT_EQ(
      grad("split", {2, 2},
           {{{6, 4}, "R,R"}, {{3, 4}, "R,R"}, {{3, 4}, "R,R"}, {{3, 4}, "R,S(1)"}, {{3, 4}, "S(1),S(0)"}}, halves),
      "R,R; R,R; R,R; R,S(1); R,S(1) | R,S(1)");
  EXPECT_THROW(grad("split", {2}, {{{6, 4}, "R"}, {{3, 4}, "R"}, {{3, 4}, "R"}}, halves), Error);
}

Attrs cut(std::vector<int64_t> axes, std::vector<int64_t> starts, std::vector<int64_t> ends) {
  return Attrs{{"axes", std::move(axes)}, {"starts", std::move(starts)}, {"ends", std::move(ends)}};
}

TEST(ShapeRules, SliceReplicatesCutDims) {
  EXPECT_EQ(fwd("slice", {2, 2}, {{{5, 7}, "S(0),S(1)"}}, cut({1}, {1}, {3})), "S(0),R | S(0),R");
  // A listed axis with the whole range is not cut: its sharding stays.
  EXPECT_EQ(fwd("slice", {2, 2}, {{{5, 7}, "S(0),S(1)"}}, cut({1}, {0}, {7})), "S(0),S(1) | S(0),S(1)");
  EXPECT_EQ(fwd("slice", {2}, {{{5, 7}, "P(max)"}}, cut({0}, {1}, {3})), "P(max) | P(max)");
  EXPECT_EQ(rev("slice", {2}, {{5, 7}}, {{{2, 7}, "S(0)"}}, cut({0}, {1}, {3})), "R | R");
  EXPECT_EQ(grad("slice", {2, 2}, {{{5, 7}, "R,R"}, {{5, 2}, "R,R"}, {{5, 2}, "S(1),S(0)"}}, cut({1}, {1}, {3})),
            "R,R; R,R; R,S(0) | R,S(0)");
}

TEST(ShapeRules, TileReplicatesRepeatedDims) {
  Attrs reps{{"repeat_times", std::vector<int64_t>{2, 1, 3}}};  // [5,1] -> [2,5,3]
  EXPECT_EQ(fwd("tile", {2}, {{{5, 1}, "S(0)"}}, reps), "S(0) | S(1)");
  EXPECT_EQ(fwd("tile", {2}, {{{5, 1}, "S(1)"}}, reps), "R | R");
  EXPECT_EQ(fwd("tile", {2}, {{{2, 3}, "S(1)"}}, Attrs{{"repeat_times", std::vector<int64_t>{1, 2}}}), "R | R");
  EXPECT_EQ(rev("tile", {2, 2}, {{5, 1}}, {{{2, 5, 3}, "S(0),S(1)"}}, reps), "R,S(0) | R,S(1)");
  // Grad: a sharded new leading dim and a repeated extent-1 dim give dx P(sum); P(max) cannot pass a sum.
  EXPECT_EQ(grad("tile", {2, 2}, {{{5, 1}, "R,R"}, {{2, 5, 3}, "R,R"}, {{2, 5, 3}, "S(0),S(2)"}}, reps),
            "R,R; R,R; S(0),S(2) | P(sum),P(sum)");
  EXPECT_EQ(grad("tile", {2}, {{{2, 3}, "R"}, {{2, 6}, "R"}, {{2, 6}, "S(1)"}},
                 Attrs{{"repeat_times", std::vector<int64_t>{1, 2}}}),
            "R; R; R | R");
  EXPECT_EQ(grad("tile", {2}, {{{2, 3}, "R"}, {{2, 6}, "R"}, {{2, 6}, "P(max)"}},
                 Attrs{{"repeat_times", std::vector<int64_t>{1, 2}}}),
            "R; R; R | R");
  EXPECT_EQ(grad("tile", {2}, {{{2, 3}, "R"}, {{2, 3}, "R"}, {{2, 3}, "P(max)"}},
                 Attrs{{"repeat_times", std::vector<int64_t>{1, 1}}}),
            "R; R; P(max) | P(max)");
}

}  // namespace
}  // namespace shardwise::spmd
