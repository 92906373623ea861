// Channel-normalization rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

std::string join(const std::vector<DistAttr>& dists) {
  std::string out;
  for (size_t i = 0; i < dists.size(); ++i) out += (i ? " ; " : "") + dists[i].to_string();
  return out;
}

std::vector<TensorSpec> specs(const ProcessMesh& mesh, const std::vector<Shape>& shapes,
                              const std::vector<std::string>& dists) {
  std::vector<TensorSpec> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    // A missing distribution is Replicate.
    DistAttr d = i < dists.size() ? parse_dist(dists[i], mesh.ndim()) : DistAttr(mesh.ndim());
    out.push_back({shapes[i], DType::F64, d});
  }
  return out;
}

// "required inputs | outputs"
std::string fwd(std::string_view rule, const ProcessMesh& mesh, const std::vector<Shape>& shapes,
                const std::vector<std::string>& dists, const Attrs& attrs) {
  auto in = specs(mesh, shapes, dists);
  SpmdResult r = rules().get(rule).forward(mesh, in, attrs);
  return join(r.inputs) + " | " + join(r.outputs);
}

std::string rev(std::string_view rule, const ProcessMesh& mesh, const std::vector<Shape>& in_shapes,
                const std::vector<Shape>& out_shapes, const std::vector<std::string>& want, const Attrs& attrs) {
  auto in = specs(mesh, in_shapes, {});
  auto out = specs(mesh, out_shapes, want);
  SpmdResult r = rules().get(rule).reverse(mesh, in, out, attrs);
  return join(r.inputs) + " | " + join(r.outputs);
}

// "required grad inputs | input grads"
std::string grad(std::string_view rule, const ProcessMesh& mesh, const std::vector<Shape>& shapes,
                 const std::vector<std::string>& dists, const Attrs& attrs) {
  auto in = specs(mesh, shapes, dists);
  SpmdResult r = rules().get(rule).grad(mesh, in, attrs);
  return join(r.inputs) + " | " + join(r.outputs);
}

Attrs bn(bool training, const char* format = "NCHW") {
  return Attrs{{"training", training}, {"data_format", std::string(format)}};
}

std::vector<Shape> bn_shapes(Shape x, int64_t c) { return {x, {c}, {c}, {c}, {c}}; }

TEST(ChannelNormRules, RegisteredWithSummaries) {
  for (const char* name : {"batch_norm", "sync_batch_norm", "group_norm", "instance_norm"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "channel_norm");
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(BatchNormRule, TrainingKeepsChannelAndReplicatesBatch) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_shapes({4, 6}, 6);
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(0),S(1)"}, bn(true)),
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  // Inference: the batch dim stays sharded.
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(0),S(1)"}, bn(false)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  // Training: x's batch sharding is dropped, which frees mesh dim 0 for scale's channel sharding.
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(0),R", "S(0),R"}, bn(true)),
            "S(1),R ; S(0),R ; S(0),R ; S(0),R ; S(0),R | S(1),R ; S(0),R ; S(0),R ; S(0),R ; S(0),R");
  // Partial inputs are resharded to Replicate.
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"P(sum),S(1)", "R,R", "P(avg),R", "R,R", "P(max),R"}, bn(false)),
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
}

TEST(BatchNormRule, ChannelsLastAndSpatialDims) {
  ProcessMesh m(Shape{2, 3});
  // NHWC: C is the last dim; H is spatial.
  auto shapes = bn_shapes({2, 3, 4}, 4);
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(1),S(2)"}, bn(true, "NHWC")),
            "R,S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | R,S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(1),S(2)"}, bn(false, "NHWC")),
            "S(1),S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | S(1),S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  // NCHW: a co-sharded channel keeps its split order.
  auto nchw = bn_shapes({2, 12, 3}, 12);
  EXPECT_EQ(fwd("batch_norm", m, nchw, {"S(1)@1,S(1)@0"}, bn(true)),
            "S(1)@1,S(1)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 | S(1)@1,S(1)@0 ; "
            "S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0");
  EXPECT_THROW(fwd("batch_norm", m, bn_shapes({2, 3, 4}, 3), {}, bn(true, "NHWC")), Error);  // C is 4
}

TEST(BatchNormRule, Reverse) {
  ProcessMesh m(Shape{2});
  auto shapes = bn_shapes({4, 6}, 6);
  // Training: a wanted batch sharding cannot be produced.
  EXPECT_EQ(rev("batch_norm", m, shapes, shapes, {"S(0)", "R", "R", "R", "R"}, bn(true)),
            "R ; R ; R ; R ; R | R ; R ; R ; R ; R");
  EXPECT_EQ(rev("batch_norm", m, shapes, shapes, {"S(0)", "R", "R", "R", "R"}, bn(false)),
            "S(0) ; R ; R ; R ; R | S(0) ; R ; R ; R ; R");
  // A wanted channel sharding of a statistic shards x's C and every parameter.
  EXPECT_EQ(rev("batch_norm", m, shapes, shapes, {"R", "R", "R", "S(0)", "P(sum)"}, bn(true)),
            "S(1) ; S(0) ; S(0) ; S(0) ; S(0) | S(1) ; S(0) ; S(0) ; S(0) ; S(0)");
}

std::vector<Shape> bn_grad_shapes(Shape x, int64_t c) {
  std::vector<Shape> s = bn_shapes(x, c);
  std::vector<Shape> outs = bn_shapes(x, c);
  s.insert(s.end(), outs.begin(), outs.end());
  s.insert(s.end(), outs.begin(), outs.end());
  return s;
}

TEST(BatchNormRule, Grad) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_grad_shapes({4, 6}, 6);
  std::vector<std::string> d(15, "R,R");
  d[0] = "S(0),S(1)";   // x
  d[2] = "P(sum),R";    // bias: not read, laid out like scale
  d[13] = "S(0),R";     // grad of saved_mean: ignored, laid out like saved_mean
  d[10] = "R,P(avg)";   // dout
  // Training: batch -> R; dout's P(avg) loses to the channel sharding on mesh dim 1.
  std::string r = grad("batch_norm", m, shapes, d, bn(true));
  EXPECT_EQ(r,
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; R,S(1) ; R,R ; R,R ; "
            "R,R ; R,R | R,S(1) ; R,S(0) ; R,S(0) ; R,R ; R,R");
  // Inference: x stays batch-sharded, dscale / dbias are P(sum) over it.
  r = grad("batch_norm", m, shapes, d, bn(false));
  EXPECT_EQ(r,
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; S(0),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | S(0),S(1) ; P(sum),S(0) ; P(sum),S(0) ; R,R ; R,R");
  // On a free mesh dim a linear dout Partial passes to every gradient; a Partial x is resharded.
  d[0] = "P(sum),S(1)";
  d[10] = "P(avg),R";
  r = grad("batch_norm", m, shapes, d, bn(true));
  EXPECT_EQ(r,
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; P(avg),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | P(avg),S(1) ; P(avg),S(0) ; P(avg),S(0) ; R,R ; R,R");
}

TEST(SyncBatchNormRule, BatchAndSpatialStaySharded) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_shapes({4, 6}, 6);
  // Training keeps the batch sharding (batch_norm would make it R); stats are global: R on it.
  EXPECT_EQ(fwd("sync_batch_norm", m, shapes, {"S(0),S(1)"}, bn(true)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  EXPECT_EQ(fwd("sync_batch_norm", m, shapes, {"S(0),S(0)"}, bn(true)),
            "S(0),S(0) ; R,R ; R,R ; R,R ; R,R | S(0),S(0) ; R,R ; R,R ; R,R ; R,R");
  // Partial inputs -> R.
  EXPECT_EQ(fwd("sync_batch_norm", m, shapes, {"P(sum),S(0)", "R,R", "P(avg),R"}, bn(true)),
            "R,S(0) ; R,R ; R,R ; R,R ; R,R | R,S(0) ; R,R ; R,R ; R,R ; R,R");
  // NHWC on [2,3]: batch on mesh dim 0, H on mesh dim 1.
  ProcessMesh m23(Shape{2, 3});
  EXPECT_EQ(fwd("sync_batch_norm", m23, bn_shapes({2, 3, 4}, 4), {"S(0),S(1)"}, bn(true, "NHWC")),
            "S(0),S(1) ; R,R ; R,R ; R,R ; R,R | S(0),S(1) ; R,R ; R,R ; R,R ; R,R");
  // A wanted batch sharding is produced (batch_norm's training reverse cannot).
  ProcessMesh m2(Shape{2});
  EXPECT_EQ(rev("sync_batch_norm", m2, shapes, shapes, {"S(0)", "R", "R", "R", "R"}, bn(true)),
            "S(0) ; R ; R ; R ; R | S(0) ; R ; R ; R ; R");
  EXPECT_THROW(fwd("sync_batch_norm", m, bn_shapes({4, 6, 2, 2, 2, 2}, 6), {}, bn(true)), Error);  // rank 6
}

TEST(SyncBatchNormRule, GradParamsReplicateInTrainingPartialInInference) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_grad_shapes({4, 6}, 6);
  std::vector<std::string> d(15, "R,R");
  d[0] = "S(0),S(1)";
  d[10] = "S(0),S(1)";
  // Training: dscale / dbias all-reduced in the kernel -> R on the batch mesh dim.
  EXPECT_EQ(grad("sync_batch_norm", m, shapes, d, bn(true)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; S(0),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | S(0),S(1) ; R,S(0) ; R,S(0) ; R,R ; R,R");
  // Inference: no reduction in the kernel -> P(sum).
  EXPECT_EQ(grad("sync_batch_norm", m, shapes, d, bn(false)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; S(0),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | S(0),S(1) ; P(sum),S(0) ; P(sum),S(0) ; R,R ; R,R");
}

Attrs gn(int64_t groups, const char* format = "NCHW") {
  return Attrs{{"groups", groups}, {"data_format", std::string(format)}};
}

TEST(GroupNormRule, ChannelKeptOnlyOnGroupBoundaries) {
  std::vector<Shape> s = {{2, 6, 3}, {6}, {6}};
  ProcessMesh m2(Shape{2}), m3(Shape{3});
  // Mesh [2] cuts C = 6 into chunks of 3: whole groups for 2 groups (3 channels each), not for 3.
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(1)"}, gn(2)), "S(1) ; S(0) ; S(0) | S(1) ; S(1) ; S(1)");
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(1)"}, gn(3)), "R ; R ; R | R ; R ; R");
  // Mesh [3]: chunks of 2, the reverse.
  EXPECT_EQ(fwd("group_norm", m3, s, {"S(1)"}, gn(3)), "S(1) ; S(0) ; S(0) | S(1) ; S(1) ; S(1)");
  EXPECT_EQ(fwd("group_norm", m3, s, {"R", "S(0)"}, gn(2)), "R ; R ; R | R ; R ; R");
  // The batch dim stays sharded, spatial dims and Partials are resharded.
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(0)"}, gn(3)), "S(0) ; R ; R | S(0) ; S(0) ; S(0)");
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(2)"}, gn(3)), "R ; R ; R | R ; R ; R");
  EXPECT_EQ(fwd("group_norm", m2, s, {"P(sum)", "P(avg)"}, gn(2)), "R ; R ; R | R ; R ; R");
}

TEST(GroupNormRule, NestedChunksAreCheckedLevelByLevel) {
  std::vector<Shape> s = {{2, 12}, {12}, {12}};
  // C = 12, 2 channels per group: [2,3] cuts 6 then 2 (kept); [2,2] cuts 6 then 3 (second dropped).
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2, 3}), s, {"S(1),S(1)"}, gn(6)),
            "S(1),S(1) ; S(0),S(0) ; S(0),S(0) | S(1),S(1) ; S(1),S(1) ; S(1),S(1)");
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2, 2}), s, {"S(1),S(1)"}, gn(6)),
            "S(1),R ; S(0),R ; S(0),R | S(1),R ; S(1),R ; S(1),R");
  // Split order mesh 1 then mesh 0 on [2,3]: 4 then 2, kept with its order.
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2, 3}), s, {"S(1)@1,S(1)@0"}, gn(6)),
            "S(1)@1,S(1)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 | S(1)@1,S(1)@0 ; S(1)@1,S(1)@0 ; S(1)@1,S(1)@0");
  // C = 10, 2 per group on [3,2]: chunks 4, 4, 2; the 2-chunk split in 2 breaks group 4: drop mesh 1.
  std::vector<Shape> s10 = {{2, 10}, {10}, {10}};
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{3, 2}), s10, {"S(1),S(1)"}, gn(5)),
            "S(1),R ; S(0),R ; S(0),R | S(1),R ; S(1),R ; S(1),R");
  // Greedy: a dropped first mesh dim does not stop a later one that aligns on its own.
  // (C = 12 on [4,2]: mesh 0's chunks of 3 split groups, mesh 1's chunks of 6 do not.)
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{4, 2}), s, {"S(1),S(1)"}, gn(6)),
            "R,S(1) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(1) ; R,S(1)");
  // NHWC: C is last.
  std::vector<Shape> nhwc = {{2, 3, 6}, {6}, {6}};
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2}), nhwc, {"S(2)"}, gn(2, "NHWC")),
            "S(2) ; S(0) ; S(0) | S(2) ; S(1) ; S(1)");
}

TEST(GroupNormRule, ReverseAndGrad) {
  ProcessMesh m(Shape{2, 3});
  std::vector<Shape> in = {{4, 6, 2}, {6}, {6}}, out = {{4, 6, 2}, {4, 3}, {4, 3}};
  // Wanted mean sharded over groups on mesh dim 1 (chunks of 2 channels: whole groups for 3 groups).
  EXPECT_EQ(rev("group_norm", m, in, out, {"S(0),R", "R,S(1)", "R,R"}, gn(3)),
            "S(0),S(1) ; R,S(0) ; R,S(0) | S(0),S(1) ; S(0),S(1) ; S(0),S(1)");
  // With 2 groups (3 channels) mesh dim 1's chunks of 2 split a group: Replicate.
  std::vector<Shape> out2 = {{4, 6, 2}, {4, 2}, {4, 2}};
  EXPECT_EQ(rev("group_norm", m, in, out2, {"R,S(2)", "R,S(1)", "P(sum),R"}, gn(2)),
            "R,R ; R,R ; R,R | R,R ; R,R ; R,R");
  // Grad: dscale / dbias are P(sum) over N's mesh dim and Shard over C's.
  std::vector<Shape> g = {{4, 6, 2}, {6}, {6}, {4, 6, 2}, {4, 3}, {4, 3}, {4, 6, 2}, {4, 3}, {4, 3}};
  std::vector<std::string> d(9, "R,R");
  d[0] = "S(0),S(1)";
  d[2] = "P(max),R";  // bias is not read: laid out like scale
  d[3] = "S(1),R";    // out is not read: kept as given
  d[7] = "P(sum),R";  // the grad of mean is ignored: laid out like mean as given
  EXPECT_EQ(grad("group_norm", m, g, d, gn(3)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; S(1),R ; S(0),S(1) ; S(0),S(1) ; S(0),S(1) ; R,R ; R,R | S(0),S(1) ; "
            "P(sum),S(0) ; P(sum),S(0)");
  d[0] = "R,S(2)";
  d[6] = "R,P(sum)";  // dout P(sum) on a free mesh dim passes
  EXPECT_EQ(grad("group_norm", m, g, d, gn(3)),
            "R,R ; R,R ; R,R ; S(1),R ; R,R ; R,R ; R,P(sum) ; R,R ; R,R | R,P(sum) ; R,P(sum) ; R,P(sum)");
}

TEST(InstanceNormRule, ForwardReverseGrad) {
  ProcessMesh m(Shape{2, 3});
  std::vector<Shape> s = {{4, 6, 2}, {6}, {6}};
  EXPECT_EQ(fwd("instance_norm", m, s, {"S(0),S(1)"}, {}),
            "S(0),S(1) ; R,S(0) ; R,S(0) | S(0),S(1) ; S(0),S(1) ; S(0),S(1)");
  EXPECT_EQ(fwd("instance_norm", m, s, {"S(2),P(sum)", "R,S(0)"}, {}),
            "R,S(1) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(1) ; R,S(1)");
  std::vector<Shape> out = {{4, 6, 2}, {4, 6}, {4, 6}};
  EXPECT_EQ(rev("instance_norm", m, s, out, {"R,S(2)", "S(1),R", "R,R"}, {}),
            "S(1),R ; S(0),R ; S(0),R | S(1),R ; S(1),R ; S(1),R");
  std::vector<Shape> g = {{4, 6, 2}, {6}, {6}, {4, 6, 2}, {4, 6}, {4, 6}, {4, 6, 2}, {4, 6}, {4, 6}};
  std::vector<std::string> d(9, "R,R");
  d[0] = "S(1),S(0)";
  EXPECT_EQ(grad("instance_norm", m, g, d, {}),
            "S(1),S(0) ; S(0),R ; S(0),R ; R,R ; S(1),S(0) ; S(1),S(0) ; S(1),S(0) ; R,R ; R,R | S(1),S(0) ; "
            "S(0),P(sum) ; S(0),P(sum)");
  EXPECT_THROW(fwd("instance_norm", m, {{4, 6}, {6}, {6}}, {}, {}), Error);  // rank 2
}

}  // namespace
}  // namespace shardwise::spmd
