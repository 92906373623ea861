// The reduction family: its kernels, SPMD rules and registry entries tested side by side.
//
// Reduction kernels against hand values, an independent naive reference (multi-index by div/mod,
// accumulated into a map keyed by the output coordinates) and finite differences.
//
// Reduction rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/reduction/kernels.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_reduce.cc)
namespace kernel_tests {
namespace {

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.at(i));
  return out;
}

Attrs axes(std::vector<int64_t> a, bool keepdim = false) {
  Attrs attrs;
  attrs.set("axis", std::move(a));
  attrs.set("keepdim", keepdim);
  return attrs;
}

// x = [[1, 2, 3], [4, 5, 6]]
Tensor small() { return f64({2, 3}, {1, 2, 3, 4, 5, 6}); }

TEST(Reduce, HandValues) {
  Tensor x = small();
  EXPECT_EQ(values(reduce(ReduceKind::Sum, x, axes({0}))), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(values(reduce(ReduceKind::Sum, x, axes({1}))), (std::vector<double>{6, 15}));
  EXPECT_EQ(values(reduce(ReduceKind::Sum, x, axes({-1}))), (std::vector<double>{6, 15}));
  Tensor all = reduce(ReduceKind::Sum, x, Attrs{});
  EXPECT_EQ(all.ndim(), 0);
  EXPECT_EQ(all.at(0), 21);
  EXPECT_EQ(reduce(ReduceKind::Sum, x, axes({}, true)).shape(), (Shape{1, 1}));
  EXPECT_EQ(reduce(ReduceKind::Sum, x, axes({0}, true)).shape(), (Shape{1, 3}));
  EXPECT_EQ(values(reduce(ReduceKind::Mean, x, axes({1}))), (std::vector<double>{2, 5}));
  EXPECT_EQ(values(reduce(ReduceKind::Max, x, axes({0}))), (std::vector<double>{4, 5, 6}));
  EXPECT_EQ(values(reduce(ReduceKind::AMax, x, axes({1}))), (std::vector<double>{3, 6}));
  EXPECT_EQ(values(reduce(ReduceKind::Min, x, axes({1}))), (std::vector<double>{1, 4}));
  EXPECT_EQ(values(reduce(ReduceKind::AMin, x, axes({0}))), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(reduce(ReduceKind::Prod, x, Attrs{}).at(0), 720);
  EXPECT_EQ(values(reduce(ReduceKind::Prod, x, axes({0}))), (std::vector<double>{4, 10, 18}));
  // A single int is accepted as a one-axis list.
  Attrs one;
  one.set("axis", int64_t{1});
  EXPECT_EQ(values(reduce(ReduceKind::Sum, x, one)), (std::vector<double>{6, 15}));
}

// Independent reference: walk every flat index, decompose it by div/mod, drop the reduced
// coordinates (or set them to 0 with keepdim) and fold into a map keyed by the output coordinates.
std::vector<double> naive(ReduceKind kind, const Tensor& x, const std::vector<int>& reduced, bool keepdim,
                          Shape& out_shape) {
  int nd = x.ndim();
  auto is_reduced = [&](int d) { return std::find(reduced.begin(), reduced.end(), d) != reduced.end(); };
  out_shape = Shape{};
  for (int d = 0; d < nd; ++d) {
    if (!is_reduced(d)) out_shape.push_back(x.shape()[d]);
    else if (keepdim) out_shape.push_back(1);
  }
  std::map<std::vector<int64_t>, std::vector<double>> groups;
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> coord(static_cast<size_t>(nd));
    int64_t rest = i;
    for (int d = nd - 1; d >= 0; --d) {
      coord[static_cast<size_t>(d)] = rest % x.shape()[d];
      rest /= x.shape()[d];
    }
    std::vector<int64_t> key;
    for (int d = 0; d < nd; ++d) {
      if (!is_reduced(d)) key.push_back(coord[static_cast<size_t>(d)]);
    }
    groups[key].push_back(x.at(i));
  }
  std::vector<double> out;  // std::map orders keys lexicographically = row-major output order
  for (auto& [key, vals] : groups) {
    double r = 0;
    switch (kind) {
      case ReduceKind::Sum: for (double v : vals) r += v; break;
      case ReduceKind::Mean: for (double v : vals) r += v / static_cast<double>(vals.size()); break;
      case ReduceKind::Prod: r = 1; for (double v : vals) r *= v; break;
      case ReduceKind::Max: case ReduceKind::AMax: r = *std::max_element(vals.begin(), vals.end()); break;
      case ReduceKind::Min: case ReduceKind::AMin: r = *std::min_element(vals.begin(), vals.end()); break;
    }
    out.push_back(r);
  }
  return out;
}

Tensor pseudo_random(const Shape& s, double lo, double hi, uint32_t seed) {
  Tensor t(DType::F64, s);
  uint32_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 1664525u + 1013904223u;
    t.set_at(i, lo + (hi - lo) * static_cast<double>(state >> 8) / static_cast<double>(1u << 24));
  }
  return t;
}

TEST(Reduce, MatchesNaiveReferenceOn3D) {
  Tensor x = pseudo_random({4, 3, 5}, 0.5, 1.5, 7);
  std::vector<std::vector<int>> axis_sets = {{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (ReduceKind kind : {ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min, ReduceKind::AMax,
                          ReduceKind::AMin, ReduceKind::Prod}) {
    for (const auto& set : axis_sets) {
      for (bool keepdim : {false, true}) {
        std::vector<int64_t> list(set.begin(), set.end());
        Shape ref_shape;
        std::vector<double> ref = naive(kind, x, set, keepdim, ref_shape);
        Tensor got = reduce(kind, x, axes(list, keepdim));
        ASSERT_EQ(got.shape(), ref_shape) << reduce_kind_name(kind);
        std::vector<double> g = values(got);
        ASSERT_EQ(g.size(), ref.size());
        for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], ref[i], 1e-12) << reduce_kind_name(kind) << " " << i;
      }
    }
  }
}

TEST(Reduce, IntegerSumsAndProductsAreExact) {
  // 2^53 + 1 + 1 is not representable on the way through a double accumulator.
  int64_t big = int64_t{1} << 53;
  Tensor x = Tensor::from<int64_t>(Shape{3}, {big, 1, 1});
  Tensor s = reduce(ReduceKind::Sum, x, Attrs{});
  EXPECT_EQ(s.dtype(), DType::I64);
  EXPECT_EQ(s.data<int64_t>()[0], big + 2);
  Tensor p = reduce(ReduceKind::Prod, Tensor::from<int32_t>(Shape{2, 2}, {-3, 7, 11, 2}), axes({1}));
  EXPECT_EQ(p.dtype(), DType::I32);
  EXPECT_EQ(p.data<int32_t>()[0], -21);
  EXPECT_EQ(p.data<int32_t>()[1], 22);
  Tensor m = reduce(ReduceKind::Max, Tensor::from<int32_t>(Shape{2, 2}, {-3, 7, 11, 2}), axes({0}));
  EXPECT_EQ(m.data<int32_t>()[0], 11);
  EXPECT_EQ(m.data<int32_t>()[1], 7);
}

TEST(Reduce, HalfSumsAccumulateWide) {
  // A half-precision running sum of ones stalls at 2048; 3000 is representable in f16.
  Tensor x = Tensor::full(DType::F16, Shape{3000}, 1.0);
  EXPECT_EQ(reduce(ReduceKind::Sum, x, Attrs{}).at(0), 3000.0);
  Tensor b = Tensor::full(DType::BF16, Shape{600}, 1.0);
  EXPECT_EQ(reduce(ReduceKind::Sum, b, Attrs{}).at(0), 600.0);  // bf16 stalls at 256
  Tensor f = Tensor::full(DType::F32, Shape{3}, 0.1);
  EXPECT_NEAR(reduce(ReduceKind::Mean, f, Attrs{}).at(0), 0.1, 1e-7);
}

TEST(Reduce, EmptyExtentGivesIdentity) {
  Tensor x(DType::F64, Shape{0, 3});
  EXPECT_EQ(values(reduce(ReduceKind::Sum, x, axes({0}))), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(values(reduce(ReduceKind::Prod, x, axes({0}))), (std::vector<double>{1, 1, 1}));
  double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(values(reduce(ReduceKind::Max, x, axes({0}))), (std::vector<double>{-inf, -inf, -inf}));
  EXPECT_EQ(values(reduce(ReduceKind::AMin, x, axes({0}))), (std::vector<double>{inf, inf, inf}));
  EXPECT_TRUE(std::isnan(reduce(ReduceKind::Mean, x, axes({0})).at(1)));
  EXPECT_EQ(reduce(ReduceKind::Sum, x, axes({0}, true)).shape(), (Shape{1, 3}));
  // Empty kept dim: an empty output.
  EXPECT_EQ(reduce(ReduceKind::Sum, x, axes({1})).shape(), (Shape{0}));
  Tensor xi(DType::I32, Shape{2, 0});
  Tensor mx = reduce(ReduceKind::Max, xi, axes({1}));
  EXPECT_EQ(mx.data<int32_t>()[0], std::numeric_limits<int32_t>::lowest());
  Tensor mn = reduce(ReduceKind::Min, xi, axes({1}));
  EXPECT_EQ(mn.data<int32_t>()[1], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(reduce(ReduceKind::Prod, xi, axes({1})).data<int32_t>()[0], 1);
}

TEST(Reduce, NanPropagatesThroughMaxAndMin) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = f64({4}, {1, nan, 3, 2});
  EXPECT_TRUE(std::isnan(reduce(ReduceKind::Max, x, Attrs{}).at(0)));
  EXPECT_TRUE(std::isnan(reduce(ReduceKind::Min, x, Attrs{}).at(0)));
  Tensor y = f64({3}, {nan, 5, 1});
  EXPECT_TRUE(std::isnan(reduce(ReduceKind::AMax, y, Attrs{}).at(0)));
}

TEST(Reduce, RejectsBadAttributesAndDtypes) {
  Tensor x = small();
  EXPECT_THROW(reduce(ReduceKind::Sum, x, axes({0, -2})), Error);  // duplicate after normalization
  EXPECT_THROW(reduce(ReduceKind::Sum, x, axes({1, 1})), Error);
  EXPECT_THROW(reduce(ReduceKind::Sum, x, axes({2})), Error);
  EXPECT_THROW(reduce(ReduceKind::Sum, x, axes({-3})), Error);
  EXPECT_THROW(reduce(ReduceKind::Mean, Tensor(DType::I64, Shape{3}), Attrs{}), Error);
  EXPECT_THROW(reduce(ReduceKind::Max, Tensor(DType::Bool, Shape{3}), Attrs{}), Error);
  Attrs bad;
  bad.set("axis", 1.5);
  EXPECT_THROW(reduce(ReduceKind::Sum, x, bad), Error);
  try {
    reduce(ReduceKind::Prod, x, axes({0, 0}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prod"), std::string::npos) << e.what();
  }
}

// ---- backward ----

Tensor backward(ReduceKind kind, const Tensor& x, const Tensor& dout, const Attrs& attrs) {
  Tensor out = reduce(kind, x, attrs);
  return reduce_backward(kind, x, out, dout, attrs);
}

TEST(ReduceBackward, SumAndMeanBroadcast) {
  Tensor x = small();
  Tensor d = f64({3}, {1, 2, 3});
  EXPECT_EQ(values(backward(ReduceKind::Sum, x, d, axes({0}))), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(values(backward(ReduceKind::Mean, x, d, axes({0}))), (std::vector<double>{0.5, 1, 1.5, 0.5, 1, 1.5}));
  Tensor dk = f64({2, 1}, {6, 12});
  EXPECT_EQ(values(backward(ReduceKind::Mean, x, dk, axes({1}, true))), (std::vector<double>{2, 2, 2, 4, 4, 4}));
  Tensor ds = f64({}, {3});
  EXPECT_EQ(values(backward(ReduceKind::Sum, x, ds, Attrs{})), (std::vector<double>(6, 3)));
}

TEST(ReduceBackward, MaxGivesEveryTieTheFullGradientAmaxSplitsIt) {
  // Row 0: max 3 twice, min 1 once; row 1: every element ties.
  Tensor x = f64({2, 4}, {3, 1, 3, 2, 5, 5, 5, 5});
  Tensor d = f64({2}, {6, 8});
  EXPECT_EQ(values(backward(ReduceKind::Max, x, d, axes({1}))), (std::vector<double>{6, 0, 6, 0, 8, 8, 8, 8}));
  EXPECT_EQ(values(backward(ReduceKind::AMax, x, d, axes({1}))), (std::vector<double>{3, 0, 3, 0, 2, 2, 2, 2}));
  EXPECT_EQ(values(backward(ReduceKind::Min, x, d, axes({1}))), (std::vector<double>{0, 6, 0, 0, 8, 8, 8, 8}));
  EXPECT_EQ(values(backward(ReduceKind::AMin, x, d, axes({1}))), (std::vector<double>{0, 6, 0, 0, 2, 2, 2, 2}));
  // Integers: amax divides with truncation, max is exact.
  Tensor xi = Tensor::from<int64_t>(Shape{3}, {4, 4, 4});
  Tensor di = Tensor::from<int64_t>(Shape{}, {7});
  EXPECT_EQ(values(backward(ReduceKind::AMax, xi, di, Attrs{})), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(values(backward(ReduceKind::Max, xi, di, Attrs{})), (std::vector<double>{7, 7, 7}));
}

TEST(ReduceBackward, MaxUsesTheGivenOutput) {
  // On a shard, out is the global max: positions not equal to it get nothing.
  Tensor x = f64({3}, {1, 2, 2});
  Tensor global_max = f64({}, {9});
  Tensor d = f64({}, {1});
  EXPECT_EQ(values(reduce_backward(ReduceKind::Max, x, global_max, d, Attrs{})), (std::vector<double>{0, 0, 0}));
  EXPECT_THROW(reduce_backward(ReduceKind::Max, x, Tensor(), d, Attrs{}), Error);
  EXPECT_THROW(reduce_backward(ReduceKind::Sum, x, Tensor(), f64({2}, {1, 1}), Attrs{}), Error);
}

TEST(ReduceBackward, ProdHandlesZerosExactly) {
  Tensor d = f64({}, {2});
  EXPECT_EQ(values(backward(ReduceKind::Prod, f64({3}, {2, 0, 3}), d, Attrs{})), (std::vector<double>{0, 12, 0}));
  EXPECT_EQ(values(backward(ReduceKind::Prod, f64({3}, {0, 0, 3}), d, Attrs{})), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(values(backward(ReduceKind::Prod, f64({3}, {2, 5, 3}), d, Attrs{})), (std::vector<double>{30, 12, 20}));
  Tensor xi = Tensor::from<int32_t>(Shape{2, 2}, {0, 4, -3, 5});
  Tensor di = Tensor::from<int32_t>(Shape{2}, {1, 2});
  EXPECT_EQ(values(backward(ReduceKind::Prod, xi, di, axes({1}))), (std::vector<double>{4, 0, 10, -6}));
  // A single element: the product of no others is 1.
  EXPECT_EQ(values(backward(ReduceKind::Prod, f64({1}, {0}), d, Attrs{})), (std::vector<double>{2}));
}

TEST(ReduceBackward, EmptyExtentGivesEmptyGradient) {
  Tensor x(DType::F64, Shape{0, 3});
  Tensor d = f64({3}, {1, 2, 3});
  for (ReduceKind kind : {ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::AMax, ReduceKind::Prod}) {
    Tensor dx = backward(kind, x, d, axes({0}));
    EXPECT_EQ(dx.shape(), (Shape{0, 3}));
  }
}

// Central differences of L = sum(dout * f(x)) against the analytic gradient; inputs are distinct
// (no ties), so max/min/amax/amin are differentiable there.
TEST(ReduceBackward, MatchesFiniteDifferences) {
  Tensor x = pseudo_random({4, 3, 5}, 0.5, 1.5, 11);
  std::vector<std::vector<int64_t>> axis_sets = {{0}, {1}, {0, 2}, {}};
  for (ReduceKind kind : {ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min, ReduceKind::AMax,
                          ReduceKind::AMin, ReduceKind::Prod}) {
    for (const auto& set : axis_sets) {
      for (bool keepdim : {false, true}) {
        Attrs attrs = axes(set, keepdim);
        Tensor out = reduce(kind, x, attrs);
        Tensor dout = pseudo_random(out.shape(), -1, 1, 5);
        Tensor dx = reduce_backward(kind, x, out, dout, attrs);
        auto loss = [&](const Tensor& xv) {
          Tensor y = reduce(kind, xv, attrs);
          double l = 0;
          for (int64_t i = 0; i < y.numel(); ++i) l += y.at(i) * dout.at(i);
          return l;
        };
        const double h = 1e-6;
        for (int64_t i = 0; i < x.numel(); ++i) {
          Tensor xp = x.clone(), xm = x.clone();
          xp.set_at(i, x.at(i) + h);
          xm.set_at(i, x.at(i) - h);
          double fd = (loss(xp) - loss(xm)) / (2 * h);
          EXPECT_NEAR(dx.at(i), fd, 1e-6) << reduce_kind_name(kind) << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_reduction_rules.cc)
namespace rule_tests {
using namespace spmd;
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
  SpmdResult r = op_registry().rule(rule).forward(mesh, in, attrs);
  EXPECT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return r.inputs[0].to_string() + " | " + r.outputs[0].to_string();
}

// Reverse from a wanted output (x's advisory distribution given).
std::string rev(std::string_view rule, const ProcessMesh& mesh, Shape shape, std::string_view x_dist,
                Shape out_shape, std::string_view want, const Attrs& attrs) {
  std::vector<TensorSpec> in = {{shape, DType::F64, parse_dist(x_dist, mesh.ndim())}};
  std::vector<TensorSpec> out = {{out_shape, DType::F64, parse_dist(want, mesh.ndim())}};
  SpmdResult r = op_registry().rule(rule).reverse(mesh, in, out, attrs);
  return r.inputs[0].to_string() + " | " + r.outputs[0].to_string();
}

// Grad: returns "x | out | dout -> dx".
std::string grad(std::string_view rule, const ProcessMesh& mesh, Shape shape, std::string_view x, Shape out_shape,
                 std::string_view out, std::string_view dout, const Attrs& attrs, DType dtype = DType::F64) {
  std::vector<TensorSpec> in = {{shape, dtype, parse_dist(x, mesh.ndim())},
                                {out_shape, dtype, parse_dist(out, mesh.ndim())},
                                {out_shape, dtype, parse_dist(dout, mesh.ndim())}};
  SpmdResult r = op_registry().rule(rule).grad(mesh, in, attrs);
  EXPECT_EQ(r.inputs.size(), 3u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return r.inputs[0].to_string() + " | " + r.inputs[1].to_string() + " | " + r.inputs[2].to_string() + " -> " +
         r.outputs[0].to_string();
}

TEST(ReductionRules, AllRegisteredWithSummaries) {
  for (const char* name :
       {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_amax", "reduce_amin", "reduce_prod"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "reduction") << name;
      }
    }
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
  EXPECT_THROW(op_registry().rule("reduce_sum").forward(m, two, Attrs{}), Error);
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
}  // namespace rule_tests

}  // namespace shardwise::ops
