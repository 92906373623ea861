// The norm family: its kernels, SPMD rules and registry entries tested side by side.
//
// layer_norm / rms_norm kernels against independent references: hand-computed values, a naive
// one-pass reference (variance as E[x^2] - E[x]^2, elements read through Tensor::at), and central
// finite differences in f64 for the backward kernels.
//
// layer_norm / rms_norm rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/ops/numeric_grad.h"
#include "shardwise/core/error.h"
#include "shardwise/ops/norm/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_norm.cc)
namespace kernel_tests {
namespace {

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }

Tensor random_f64(const Shape& s, unsigned seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (double& x : v) x = d(gen);
  return f64(s, v);
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.at(i));
  return out;
}

void expect_near(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.at(static_cast<int64_t>(i)), want[i], tol) << what << " at " << i;
  }
}

TEST(LayerNorm, HandValues) {
  // Row 0: mean 2, var 2/3; row 1: mean 6, var 8/3; both normalize to [-a, 0, a], a = sqrt(1.5).
  Tensor x = f64({2, 3}, {1, 2, 3, 4, 6, 8});
  Tensor scale = f64({3}, {1, 2, 3});
  Tensor bias = f64({3}, {0.5, 0, -1});
  LayerNormOutputs r = layer_norm(x, scale, bias, -1, 0.0);
  double a = std::sqrt(1.5);
  expect_near(r.out, {-a + 0.5, 0, 3 * a - 1, -a + 0.5, 0, 3 * a - 1}, 1e-12, "out");
  EXPECT_EQ(r.mean.shape(), (Shape{2}));
  expect_near(r.mean, {2, 6}, 1e-12, "mean");
  expect_near(r.rstd, {1 / std::sqrt(2.0 / 3), 1 / std::sqrt(8.0 / 3)}, 1e-12, "rstd");
  // epsilon enters under the square root.
  LayerNormOutputs e = layer_norm(x, scale, bias, 1, 1.0);
  expect_near(e.rstd, {1 / std::sqrt(2.0 / 3 + 1), 1 / std::sqrt(8.0 / 3 + 1)}, 1e-12, "rstd with epsilon");
}

TEST(RmsNorm, HandValues) {
  // Row 0: mean square (9 + 16) / 2 = 12.5; row 1: (1 + 1) / 2 = 1.
  Tensor x = f64({2, 2}, {3, 4, 1, -1});
  Tensor scale = f64({2}, {2, 0.5});
  RmsNormOutputs r = rms_norm(x, scale, -1, 0.0);
  double i0 = 1 / std::sqrt(12.5);
  expect_near(r.inv_rms, {i0, 1}, 1e-12, "inv_rms");
  expect_near(r.out, {3 * i0 * 2, 4 * i0 * 0.5, 2, -0.5}, 1e-12, "out");
}

// The naive reference: one pass per row summing x and x^2, variance as E[x^2] - E[x]^2.
struct NaiveNorm {
  std::vector<double> out, mean, rstd;
};
NaiveNorm naive_layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, int k, double eps, bool rms) {
  const Shape& s = x.shape();
  int64_t rows = 1, cols = 1;
  for (int d = 0; d < s.ndim(); ++d) (d < k ? rows : cols) *= s[d];
  NaiveNorm r;
  r.out.resize(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < rows; ++i) {
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < cols; ++j) {
      double v = x.at(i * cols + j);
      s1 += v;
      s2 += v * v;
    }
    double mean = rms ? 0.0 : s1 / cols;
    double var = s2 / cols - mean * mean;
    double rstd = 1 / std::sqrt(var + eps);
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
    for (int64_t j = 0; j < cols; ++j) {
      double y = (x.at(i * cols + j) - mean) * rstd * scale.at(j);
      if (!rms) y += bias.at(j);
      r.out[static_cast<size_t>(i * cols + j)] = y;
    }
  }
  return r;
}

TEST(LayerNorm, MatchesNaiveReferenceForEveryBeginAxis) {
  Shape shape{3, 4, 5};
  Tensor x = random_f64(shape, 1);
  for (int k : {0, 1, 2, -1, -2}) {
    int kk = k < 0 ? k + 3 : k;
    Shape trailing = norm_trailing_shape(shape, kk);
    Tensor scale = random_f64(trailing, 2), bias = random_f64(trailing, 3);
    LayerNormOutputs r = layer_norm(x, scale, bias, k, 1e-5);
    NaiveNorm want = naive_layer_norm(x, scale, bias, kk, 1e-5, false);
    EXPECT_EQ(r.mean.shape(), norm_leading_shape(shape, kk)) << "k " << k;  // not flattened
    EXPECT_EQ(r.rstd.shape(), norm_leading_shape(shape, kk)) << "k " << k;
    expect_near(r.out, want.out, 1e-10, "out");
    expect_near(r.mean, want.mean, 1e-12, "mean");
    expect_near(r.rstd, want.rstd, 1e-9, "rstd");
    RmsNormOutputs q = rms_norm(x, scale, k, 1e-6);
    NaiveNorm wq = naive_layer_norm(x, scale, bias, kk, 1e-6, true);
    EXPECT_EQ(q.inv_rms.shape(), norm_leading_shape(shape, kk));
    expect_near(q.out, wq.out, 1e-10, "rms out");
    expect_near(q.inv_rms, wq.rstd, 1e-10, "inv_rms");
  }
}

TEST(LayerNorm, DefaultAxisAndShapesOfTheHelpers) {
  EXPECT_EQ(norm_begin_axis(Attrs{}, 3, "t"), 2);
  EXPECT_EQ(norm_begin_axis(Attrs{{"begin_norm_axis", int64_t{-2}}}, 3, "t"), 1);
  EXPECT_EQ(norm_begin_axis(Attrs{{"begin_norm_axis", int64_t{0}}}, 3, "t"), 0);
  EXPECT_THROW(norm_begin_axis(Attrs{{"begin_norm_axis", int64_t{3}}}, 3, "t"), Error);
  EXPECT_THROW(norm_begin_axis(Attrs{{"begin_norm_axis", int64_t{-4}}}, 3, "t"), Error);
  EXPECT_THROW(norm_begin_axis(Attrs{}, 0, "t"), Error);
  EXPECT_EQ(norm_leading_shape({2, 3, 4}, 1), (Shape{2}));
  EXPECT_EQ(norm_trailing_shape({2, 3, 4}, 1), (Shape{3, 4}));
  EXPECT_EQ(norm_stat_dtype(DType::F16), DType::F32);
  EXPECT_EQ(norm_stat_dtype(DType::F64), DType::F64);
}

TEST(LayerNorm, RejectsBadArguments) {
  Tensor x = random_f64({2, 3}, 4);
  Tensor s3 = random_f64({3}, 5), s2 = random_f64({2}, 6);
  EXPECT_THROW(layer_norm(x, s2, s3, -1, 1e-5), Error);  // scale shape
  EXPECT_THROW(layer_norm(x, s3, s3.reshaped({1, 3}), -1, 1e-5), Error);  // bias rank
  EXPECT_THROW(layer_norm(x, s3.to(DType::F32), s3, -1, 1e-5), Error);  // dtype
  EXPECT_THROW(layer_norm(x.to(DType::I64), s3.to(DType::I64), s3.to(DType::I64), -1, 1e-5), Error);
  EXPECT_THROW(rms_norm(x, s3, 2, 1e-6), Error);
  EXPECT_THROW(layer_norm(x, Tensor(), s3, -1, 1e-5), Error);
  try {
    layer_norm(x, s2, s3, -1, 1e-5);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale"), std::string::npos) << e.what();
  }
}

TEST(LayerNorm, EmptyRowsGiveEmptyOutputsAndZeroParamGrads) {
  Tensor x(DType::F64, {0, 4});
  Tensor scale = random_f64({4}, 7), bias = random_f64({4}, 8);
  LayerNormOutputs r = layer_norm(x, scale, bias, -1, 1e-5);
  EXPECT_EQ(r.out.shape(), (Shape{0, 4}));
  EXPECT_EQ(r.mean.shape(), (Shape{0}));
  LayerNormGrads g = layer_norm_backward(x, scale, r.mean, r.rstd, Tensor(DType::F64, {0, 4}), -1);
  EXPECT_EQ(g.dx.shape(), (Shape{0, 4}));
  EXPECT_EQ(values(g.dscale), std::vector<double>(4, 0.0));
  EXPECT_EQ(values(g.dbias), std::vector<double>(4, 0.0));
  RmsNormOutputs q = rms_norm(x, scale, -1, 1e-6);
  EXPECT_EQ(q.inv_rms.shape(), (Shape{0}));
  RmsNormGrads qg = rms_norm_backward(x, scale, q.inv_rms, Tensor(DType::F64, {0, 4}), -1);
  EXPECT_EQ(values(qg.dscale), std::vector<double>(4, 0.0));
}

using testing_util::numeric_grad;

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  for (auto [shape, k] : {std::pair<Shape, int>{{3, 5}, -1}, {{2, 3, 4}, 1}, {{2, 3}, 0}}) {
    int kk = k < 0 ? k + shape.ndim() : k;
    Tensor x = random_f64(shape, 11);
    Tensor scale = random_f64(norm_trailing_shape(shape, kk), 12);
    Tensor bias = random_f64(norm_trailing_shape(shape, kk), 13);
    Tensor w = random_f64(shape, 14);
    LayerNormOutputs r = layer_norm(x, scale, bias, k, 1e-5);
    LayerNormGrads g = layer_norm_backward(x, scale, r.mean, r.rstd, w, k);
    auto out = [&] { return layer_norm(x, scale, bias, k, 1e-5).out; };
    expect_near(g.dx, numeric_grad(x, w, out), 1e-6, "dx");
    expect_near(g.dscale, numeric_grad(scale, w, out), 1e-6, "dscale");
    expect_near(g.dbias, numeric_grad(bias, w, out), 1e-6, "dbias");
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  for (auto [shape, k] : {std::pair<Shape, int>{{3, 5}, -1}, {{2, 3, 4}, 1}}) {
    int kk = k < 0 ? k + shape.ndim() : k;
    Tensor x = random_f64(shape, 21);
    Tensor scale = random_f64(norm_trailing_shape(shape, kk), 22);
    Tensor w = random_f64(shape, 23);
    RmsNormOutputs r = rms_norm(x, scale, k, 1e-6);
    RmsNormGrads g = rms_norm_backward(x, scale, r.inv_rms, w, k);
    auto out = [&] { return rms_norm(x, scale, k, 1e-6).out; };
    expect_near(g.dx, numeric_grad(x, w, out), 1e-6, "dx");
    expect_near(g.dscale, numeric_grad(scale, w, out), 1e-6, "dscale");
  }
}

TEST(LayerNorm, LowerPrecisionFollowsF64) {
  Tensor x = random_f64({4, 6}, 31), scale = random_f64({6}, 32), bias = random_f64({6}, 33);
  LayerNormOutputs ref = layer_norm(x, scale, bias, -1, 1e-5);
  LayerNormOutputs f32 = layer_norm(x.to(DType::F32), scale.to(DType::F32), bias.to(DType::F32), -1, 1e-5);
  EXPECT_EQ(f32.mean.dtype(), DType::F32);
  EXPECT_TRUE(compare(f32.out.to(DType::F64), ref.out, 1e-5, 1e-5).equal);
  LayerNormOutputs f16 = layer_norm(x.to(DType::F16), scale.to(DType::F16), bias.to(DType::F16), -1, 1e-5);
  EXPECT_EQ(f16.out.dtype(), DType::F16);
  EXPECT_EQ(f16.rstd.dtype(), DType::F32);
  EXPECT_TRUE(compare(f16.out.to(DType::F64), ref.out, 2e-2, 2e-2).equal);
  Tensor w = random_f64({4, 6}, 34);
  LayerNormGrads g64 = layer_norm_backward(x, scale, ref.mean, ref.rstd, w, -1);
  LayerNormGrads g16 = layer_norm_backward(x.to(DType::F16), scale.to(DType::F16), f16.mean, f16.rstd,
                                           w.to(DType::F16), -1);
  EXPECT_TRUE(compare(g16.dx.to(DType::F64), g64.dx, 5e-2, 5e-2).equal);
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_norm_rules.cc)
namespace rule_tests {
using namespace spmd;
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
  SpmdResult r = op_registry().rule(rule).forward(m, in, axis(k));
  return join(r.inputs) + " -> " + join(r.outputs);
}

// Reverse from wanted outputs (inputs' advisory distributions Replicate).
std::string rev(const char* rule, Shape x, int k, std::vector<std::string> want) {
  int params = std::string(rule) == "layer_norm" ? 2 : 1;
  std::vector<TensorSpec> in = {{x, DType::F64, DistAttr(2)}};
  for (int p = 0; p < params; ++p) in.push_back({trailing(x, k), DType::F64, DistAttr(2)});
  std::vector<TensorSpec> out = {{x, DType::F64, parse_dist(want[0], 2)}};
  for (size_t s = 1; s < want.size(); ++s) out.push_back({leading(x, k), DType::F64, parse_dist(want[s], 2)});
  SpmdResult r = op_registry().rule(rule).reverse(kMesh22, in, out, axis(k));
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
  SpmdResult r = op_registry().rule(rule).grad(kMesh22, in, axis(k));
  EXPECT_EQ(r.inputs.size(), in.size());
  EXPECT_EQ(r.outputs.size(), static_cast<size_t>(1 + params));
  return join(r.inputs) + " -> " + join(r.outputs);
}

TEST(NormRules, RegisteredWithSummaries) {
  for (const char* name : {"layer_norm", "rms_norm"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "norm") << name;
      }
    }
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
  EXPECT_THROW(op_registry().rule("rms_norm").forward(kMesh22, in, axis(-1)), Error);
  EXPECT_THROW(op_registry().rule("rms_norm").forward(kMesh22, in, axis(2)), Error);
  EXPECT_THROW(op_registry().rule("layer_norm").forward(kMesh22, in, axis(-1)), Error);  // 2 inputs for 3
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
}  // namespace rule_tests

}  // namespace shardwise::ops
