// layer_norm / rms_norm rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

const ProcessMesh kMesh22(Shape{2, 2});

Attrs axis(int64_t k) { return Attrs{{"begin_norm_axis", k}}; }

Shape trailing(const Shape& x, int k) {
  if (k < 0) k += x.ndim();
  Shape s;
  for (int d = k; d < x.ndim(); ++d) s.push_back(x[d]);
  return s;
}
Shape leading(const Shape& x, int k) {
  if (k < 0) k += x.ndim();
  Shape s;
  for (int d = 0; d < k; ++d) s.push_back(x[d]);
  return s;
}

std::string join(const std::vector<DistAttr>& dists) {
  std::string out;
  for (size_t i = 0; i < dists.size(); ++i) out += (i ? " | " : "") + dists[i].to_string();
  return out;
}

// Forward: "x | scale [| bias] -> out | stats..".
std::string fwd(const char* rule, Shape x, int k, std::vector<std::string> dists, const ProcessMesh& m = kMesh22) {
  std::vector<TensorSpec> in = {{x, DType::F64, parse_dist(dists[0], m.ndim())}};
  for (size_t p = 1; p < dists.size(); ++p) in.push_back({trailing(x, k), DType::F64, parse_dist(dists[p], m.ndim())});
  SpmdResult r = rules().get(rule).forward(m, in, axis(k));
  return join(r.inputs) + " -> " + join(r.outputs);
}

// Reverse from wanted outputs (inputs' advisory distributions Replicate).
std::string rev(const char* rule, Shape x, int k, std::vector<std::string> want) {
  int params = std::string(rule) == "layer_norm" ? 2 : 1;
  std::vector<TensorSpec> in = {{x, DType::F64, DistAttr(2)}};
  for (int p = 0; p < params; ++p) in.push_back({trailing(x, k), DType::F64, DistAttr(2)});
  std::vector<TensorSpec> out = {{x, DType::F64, parse_dist(want[0], 2)}};
  for (size_t s = 1; s < want.size(); ++s) out.push_back({leading(x, k), DType::F64, parse_dist(want[s], 2)});
  SpmdResult r = rules().get(rule).reverse(kMesh22, in, out, axis(k));
  return join(r.inputs) + " -> " + join(r.outputs);
}

// Grad of layer_norm: dists of x, scale, bias, out, mean, rstd, dout, dmean, drstd.
std::string grad(const char* rule, Shape x, int k, std::vector<std::string> d) {
  bool layer = std::string(rule) == "layer_norm";
  int params = layer ? 2 : 1, stats = layer ? 2 : 1;
  std::vector<Shape> shapes = {x};
  for (int p = 0; p < params; ++p) shapes.push_back(trailing(x, k));
  shapes.push_back(x);
  for (int s = 0; s < stats; ++s) shapes.push_back(leading(x, k));
  shapes.push_back(x);
  for (int s = 0; s < stats; ++s) shapes.push_back(leading(x, k));
  EXPECT_EQ(shapes.size(), d.size());
  std::vector<TensorSpec> in;
  for (size_t i = 0; i < shapes.size(); ++i) in.push_back({shapes[i], DType::F64, parse_dist(d[i], 2)});
  SpmdResult r = rules().get(rule).grad(kMesh22, in, axis(k));
  EXPECT_EQ(r.inputs.size(), in.size());
  EXPECT_EQ(r.outputs.size(), static_cast<size_t>(1 + params));
  return join(r.inputs) + " -> " + join(r.outputs);
}

TEST(NormRules, RegisteredWithSummaries) {
  for (const char* name : {"layer_norm", "rms_norm"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "norm");
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(NormRules, LayerNormKeepsLeadingShardsAndReplicatesNormalizedDims) {
  // Dim 1 is normalized: its shard on mesh dim 1 is dropped; scale and bias are Replicate.
  EXPECT_EQ(fwd("layer_norm", {4, 6}, 1, {"S(0),S(1)", "S(0),R", "P(sum),R"}),
            "S(0),R | R,R | R,R -> S(0),R | S(0),R | S(0),R");
  // Normalizing the last two dims of a 3-D x: only dim 0 may stay sharded; the stats are [2].
  EXPECT_EQ(fwd("layer_norm", {2, 3, 4}, 1, {"S(1),S(0)", "R,R", "R,R"}),
            "R,S(0) | R,R | R,R -> R,S(0) | R,S(0) | R,S(0)");
  // k = 0: everything normalized, scalar statistics.
  EXPECT_EQ(fwd("layer_norm", {4, 6}, 0, {"S(0),S(1)", "R,R", "R,R"}), "R,R | R,R | R,R -> R,R | R,R | R,R");
  // Partial x is resharded; the other mesh dim keeps its shard.
  EXPECT_EQ(fwd("layer_norm", {4, 6}, -1, {"P(sum),S(0)", "R,P(avg)", "R,R"}),
            "R,S(0) | R,R | R,R -> R,S(0) | R,S(0) | R,S(0)");
  // Co-sharded leading dim keeps its order in x, out and the statistics.
  EXPECT_EQ(fwd("layer_norm", {4, 6}, -1, {"S(0)@1,S(0)@0", "R,R", "R,R"}),
            "S(0)@1,S(0)@0 | R,R | R,R -> S(0)@1,S(0)@0 | S(0)@1,S(0)@0 | S(0)@1,S(0)@0");
  // Uneven and smaller-than-mesh leading dims stay sharded (empty rows are fine).
  EXPECT_EQ(fwd("layer_norm", {1, 6}, -1, {"S(0),R", "R,R", "R,R"}), "S(0),R | R,R | R,R -> S(0),R | S(0),R | S(0),R");
}

TEST(NormRules, RmsNormForward) {
  EXPECT_EQ(fwd("rms_norm", {4, 6}, -1, {"S(1),S(0)", "S(0),R"}), "R,S(0) | R,R -> R,S(0) | R,S(0)");
  EXPECT_EQ(fwd("rms_norm", {2, 3, 4}, 2, {"S(0),S(1)", "R,R"}), "S(0),S(1) | R,R -> S(0),S(1) | S(0),S(1)");
  EXPECT_EQ(fwd("rms_norm", {4, 6}, -1, {"P(max),P(avg)", "R,R"}), "R,R | R,R -> R,R | R,R");
}

TEST(NormRules, RejectsMismatchedParameterShapes) {
  std::vector<TensorSpec> in = {{{4, 6}, DType::F64, DistAttr(2)}, {{4}, DType::F64, DistAttr(2)}};
  EXPECT_THROW(rules().get("rms_norm").forward(kMesh22, in, axis(-1)), Error);
  EXPECT_THROW(rules().get("rms_norm").forward(kMesh22, in, axis(2)), Error);
  EXPECT_THROW(rules().get("layer_norm").forward(kMesh22, in, axis(-1)), Error);  // 2 inputs for 3
}

TEST(NormRules, ReverseTakesLeadingDimsFromOutThenStatistics) {
  // The wanted out shards the normalized dim on mesh 0 (dropped) and the leading dim on mesh 1.
  EXPECT_EQ(rev("layer_norm", {4, 6}, -1, {"S(1),S(0)", "R,R", "R,R"}),
            "R,S(0) | R,R | R,R -> R,S(0) | R,S(0) | R,S(0)");
  // A replicated out: the wanted mean decides; Partials become Replicate.
  EXPECT_EQ(rev("layer_norm", {4, 6}, -1, {"P(sum),R", "S(0),R", "R,S(0)"}),
            "S(0),R | R,R | R,R -> S(0),R | S(0),R | S(0),R");
  EXPECT_EQ(rev("rms_norm", {2, 3, 4}, 2, {"R,R", "S(1),S(0)"}), "S(1),S(0) | R,R -> S(1),S(0) | S(1),S(0)");
}

TEST(NormRules, GradShardsRowsAndMakesParamGradsPartial) {
  // x wins the leading dim on mesh 0; dout's shard of it on mesh 1 is dropped. bias, out and the
  // statistics' gradients are not read: kept as given.
  EXPECT_EQ(grad("layer_norm", {4, 6}, -1,
                 {"S(0),R", "S(0),R", "P(max),S(0)", "R,S(1)", "R,R", "R,R", "R,S(0)", "P(sum),R", "S(0),P(min)"}),
            "S(0),R | R,R | P(max),S(0) | R,S(1) | S(0),R | S(0),R | S(0),R | P(sum),R | S(0),P(min) -> "
            "S(0),R | P(sum),R | P(sum),R");
  // A Partial dout is reduced first (where Megatron-LM all-reduces it): dx, dscale, dbias carry
  // no Partial on that mesh dim.
  EXPECT_EQ(grad("layer_norm", {4, 6}, -1,
                 {"S(0),R", "R,R", "R,R", "S(0),R", "S(0),R", "S(0),R", "R,P(avg)", "R,R", "R,R"}),
            "S(0),R | R,R | R,R | S(0),R | S(0),R | S(0),R | S(0),R | R,R | R,R -> "
            "S(0),R | P(sum),R | P(sum),R");
  // dout P(max) is not linear: Replicate. Partial x: Replicate. dout may define the rows.
  EXPECT_EQ(grad("layer_norm", {4, 6}, -1,
                 {"P(sum),R", "R,R", "R,R", "R,R", "R,R", "R,R", "P(max),S(0)", "R,R", "R,R"}),
            "R,S(0) | R,R | R,R | R,R | R,S(0) | R,S(0) | R,S(0) | R,R | R,R -> R,S(0) | R,P(sum) | R,P(sum)");
  // Normalized dims of dout are resharded; two leading dims split over both mesh dims.
  EXPECT_EQ(grad("rms_norm", {2, 3, 4}, 2, {"S(0),S(2)", "R,R", "R,R", "R,R", "R,S(1)", "R,R"}),
            "S(0),S(1) | R,R | R,R | S(0),S(1) | S(0),S(1) | R,R -> S(0),S(1) | P(sum),P(sum)");
}

}  // namespace
}  // namespace shardwise::spmd
