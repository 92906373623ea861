// The misc family: its kernels, SPMD rules and registry entries tested side by side.
//
// dropout, cumsum, argmax/argmin and topk kernels against hand values and independent naive
// references (multi-index by div/mod, Philox drawn element by element).
//
// Rules of dropout, cumsum, arg_reduce (argmax/argmin) and topk against hand-derived
// expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/ops/misc/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_misc_ops.cc)
namespace kernel_tests {
namespace {

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.at(i));
  return out;
}

Tensor iota(DType dtype, const Shape& s, double start = 0, double step = 1) {
  Tensor t(dtype, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_at(i, start + step * static_cast<double>(i));
  return t;
}

// Deterministic pseudo-random values in [-2, 2) not produced by the kernels' generator.
Tensor lcg(const Shape& s, uint64_t seed) {
  Tensor t(DType::F64, s);
  for (int64_t i = 0; i < t.numel(); ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t.set_at(i, static_cast<double>(seed >> 11) / 9007199254740992.0 * 4.0 - 2.0);
  }
  return t;
}

// ---------------- misc_axis ----------------

TEST(MiscAxis, NormalizesAndNamesTheOp) {
  EXPECT_EQ(misc_axis(Attrs{{"axis", int64_t{-1}}}, 3, "cumsum", std::nullopt), 2);
  EXPECT_EQ(misc_axis(Attrs{}, 3, "topk", -1), 2);
  EXPECT_THROW(misc_axis(Attrs{}, 3, "cumsum", std::nullopt), Error);
  EXPECT_THROW(misc_axis(Attrs{{"axis", int64_t{3}}}, 3, "cumsum", std::nullopt), Error);
  EXPECT_THROW(misc_axis(Attrs{{"axis", std::vector<int64_t>{0, 1}}}, 3, "cumsum", std::nullopt), Error);
  EXPECT_THROW(misc_axis(Attrs{{"axis", int64_t{0}}}, 0, "cumsum", std::nullopt), Error);
  try {
    misc_axis(Attrs{{"axis", int64_t{5}}}, 2, "argmax", std::nullopt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argmax"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("5"), std::string::npos);
  }
}

// ---------------- cumsum ----------------

TEST(Cumsum, HandValues) {
  Tensor x = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values(cumsum(x, 1)), (std::vector<double>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(values(cumsum(x, 0)), (std::vector<double>{1, 2, 3, 5, 7, 9}));
  // Gradient: reverse cumsum. d/dx_j sum_i w_i cumsum_i = sum_{i >= j} w_i.
  Tensor dy = f64({2, 3}, {1, 10, 100, 1, 1, 1});
  EXPECT_EQ(values(cumsum_backward(dy, 1)), (std::vector<double>{111, 110, 100, 3, 2, 1}));
  EXPECT_EQ(values(cumsum_backward(dy, 0)), (std::vector<double>{2, 11, 101, 1, 1, 1}));
}

TEST(Cumsum, IntegersWrapAndBoolIsRejected) {
  Tensor x = Tensor::from<int8_t>(Shape{3}, std::vector<int8_t>{100, 100, 100});
  Tensor y = cumsum(x, 0);
  EXPECT_EQ(y.dtype(), DType::I8);
  EXPECT_EQ(values(y), (std::vector<double>{100, -56, 44}));
  Tensor big = Tensor::from<int64_t>(Shape{2}, std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 1});
  EXPECT_EQ(cumsum(big, 0).data<int64_t>()[1], std::numeric_limits<int64_t>::min());
  EXPECT_THROW(cumsum(Tensor(DType::Bool, Shape{3}), 0), Error);
}

TEST(Cumsum, MatchesNaiveLoopOn3dAndEmpty) {
  Shape s{3, 4, 5};
  Tensor x = lcg(s, 7);
  for (int axis = 0; axis < 3; ++axis) {
    Tensor y = cumsum(x, axis);
    for (int64_t f = 0; f < x.numel(); ++f) {
      int64_t c[3] = {f / 20, (f / 5) % 4, f % 5};
      double expect = 0;
      for (int64_t k = 0; k <= c[axis]; ++k) {
        int64_t cc[3] = {c[0], c[1], c[2]};
        cc[axis] = k;
        expect += x.at(cc[0] * 20 + cc[1] * 5 + cc[2]);
      }
      ASSERT_NEAR(y.at(f), expect, 1e-12) << "axis " << axis << " flat " << f;
    }
  }
  Tensor e = cumsum(Tensor(DType::F32, Shape{0, 4}), 1);
  EXPECT_EQ(e.shape(), (Shape{0, 4}));
  EXPECT_EQ(cumsum(Tensor(DType::F32, Shape{3, 0}), 1).numel(), 0);
}

// ---------------- argmax / argmin ----------------

TEST(ArgReduce, TiesGiveTheFirstIndex) {
  Tensor x = f64({2, 3}, {1, 3, 3, 2, 2, 1});
  Tensor a = argmax(x, 1, false);
  EXPECT_EQ(a.dtype(), DType::I64);
  EXPECT_EQ(a.shape(), (Shape{2}));
  EXPECT_EQ(values(a), (std::vector<double>{1, 0}));
  EXPECT_EQ(values(argmin(x, 1, false)), (std::vector<double>{0, 2}));
  Tensor k = argmax(x, 0, true);
  EXPECT_EQ(k.shape(), (Shape{1, 3}));
  EXPECT_EQ(values(k), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(values(argmin(x, 0, false)), (std::vector<double>{0, 1, 1}));
  // All equal: index 0.
  EXPECT_EQ(values(argmax(f64({4}, {2, 2, 2, 2}), 0, false)), (std::vector<double>{0}));
  EXPECT_EQ(argmax(f64({4}, {2, 2, 2, 2}), 0, false).ndim(), 0);
}

TEST(ArgReduce, NanIsTheExtremumAndIntegersWork) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = f64({5}, {1, nan, 5, nan, -3});
  EXPECT_EQ(values(argmax(x, 0, false)), (std::vector<double>{1}));
  EXPECT_EQ(values(argmin(x, 0, false)), (std::vector<double>{1}));
  Tensor i = Tensor::from<int32_t>(Shape{2, 3}, std::vector<int32_t>{-5, 7, 7, 0, -9, -9});
  EXPECT_EQ(values(argmax(i, 1, false)), (std::vector<double>{1, 0}));
  EXPECT_EQ(values(argmin(i, 1, false)), (std::vector<double>{0, 1}));
  EXPECT_EQ(values(argmin(i.to(DType::F16), 1, false)), (std::vector<double>{0, 1}));
  EXPECT_THROW(argmax(Tensor(DType::Bool, Shape{3}), 0, false), Error);
}

TEST(ArgReduce, EmptyAxisIsAnErrorUnlessTheOutputIsEmpty) {
  EXPECT_THROW(argmax(Tensor(DType::F64, Shape{2, 0}), 1, false), Error);
  Tensor e = argmax(Tensor(DType::F64, Shape{0, 3}), 1, false);
  EXPECT_EQ(e.shape(), (Shape{0}));
  EXPECT_THROW(argmin(Tensor(DType::F64, Shape{0, 3}), 0, true), Error);  // 3 outputs, nothing to pick from
}

TEST(ArgReduce, MatchesNaiveLoopOn3d) {
  Tensor x = lcg({3, 4, 5}, 11);
  // Round to a coarse grid so ties happen.
  for (int64_t i = 0; i < x.numel(); ++i) x.set_at(i, std::round(x.at(i)));
  for (int axis = 0; axis < 3; ++axis) {
    Tensor a = argmax(x, axis, false), b = argmin(x, axis, false);
    const int64_t ext[3] = {3, 4, 5};
    int64_t o = 0;
    for (int64_t i0 = 0; i0 < (axis == 0 ? 1 : 3); ++i0) {
      for (int64_t i1 = 0; i1 < (axis == 1 ? 1 : 4); ++i1) {
        for (int64_t i2 = 0; i2 < (axis == 2 ? 1 : 5); ++i2, ++o) {
          int64_t best_max = -1, best_min = -1;
          double vmax = -1e300, vmin = 1e300;
          for (int64_t k = 0; k < ext[axis]; ++k) {
            int64_t c[3] = {i0, i1, i2};
            c[axis] = k;
            double v = x.at(c[0] * 20 + c[1] * 5 + c[2]);
            if (v > vmax) vmax = v, best_max = k;
            if (v < vmin) vmin = v, best_min = k;
          }
          ASSERT_EQ(a.at(o), best_max) << axis;
          ASSERT_EQ(b.at(o), best_min) << axis;
        }
      }
    }
  }
}

// ---------------- topk ----------------

TopkArgs targs(int64_t k, int axis, bool largest = true, bool sorted = true) { return {k, axis, largest, sorted}; }

TEST(Topk, HandValuesTiesAndOrder) {
  Tensor x = f64({5}, {1, 3, 3, 2, 3});
  TopkResult r = topk(x, targs(2, 0));
  EXPECT_EQ(values(r.values), (std::vector<double>{3, 3}));
  EXPECT_EQ(values(r.indices), (std::vector<double>{1, 2}));
  EXPECT_EQ(r.indices.dtype(), DType::I64);
  r = topk(x, targs(2, 0, false));
  EXPECT_EQ(values(r.values), (std::vector<double>{1, 2}));
  EXPECT_EQ(values(r.indices), (std::vector<double>{0, 3}));
  r = topk(x, targs(4, 0, false));
  EXPECT_EQ(values(r.indices), (std::vector<double>{0, 3, 1, 2}));
  Tensor y = f64({4}, {4, 1, 5, 2});
  EXPECT_EQ(values(topk(y, targs(2, 0)).indices), (std::vector<double>{2, 0}));
  EXPECT_EQ(values(topk(y, targs(2, 0, true, false)).indices), (std::vector<double>{0, 2}));
  EXPECT_EQ(values(topk(y, targs(2, 0, true, false)).values), (std::vector<double>{4, 5}));
  EXPECT_EQ(topk(y, targs(0, 0)).values.shape(), (Shape{0}));
}

TEST(Topk, AlongAnInnerAxisAndNan) {
  // x[i][j] = column j of rows [[3, 1], [5, 1], [4, 9]]; topk along axis 0.
  Tensor x = f64({3, 2}, {3, 1, 5, 1, 4, 9});
  TopkResult r = topk(x, targs(2, 0));
  EXPECT_EQ(r.values.shape(), (Shape{2, 2}));
  EXPECT_EQ(values(r.values), (std::vector<double>{5, 9, 4, 1}));
  EXPECT_EQ(values(r.indices), (std::vector<double>{1, 2, 2, 0}));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor n = f64({4}, {1, nan, 7, 0});
  r = topk(n, targs(2, 0));
  EXPECT_TRUE(std::isnan(r.values.at(0)));
  EXPECT_EQ(values(r.indices), (std::vector<double>{1, 2}));
  EXPECT_EQ(values(topk(n, targs(2, 0, false)).indices), (std::vector<double>{3, 0}));
}

TEST(Topk, ArgsAndErrors) {
  Attrs a{{"k", int64_t{2}}};
  TopkArgs t = topk_args(a, Shape{3, 4});
  EXPECT_EQ(t.axis, 1);
  EXPECT_TRUE(t.largest);
  EXPECT_TRUE(t.sorted);
  EXPECT_THROW(topk_args(Attrs{{"k", int64_t{5}}}, Shape{3, 4}), Error);
  EXPECT_THROW(topk_args(Attrs{}, Shape{3, 4}), Error);
  EXPECT_THROW(topk(Tensor(DType::Bool, Shape{3}), targs(1, 0)), Error);
}

TEST(Topk, BackwardScattersIntoZeros) {
  Tensor x = f64({2, 4}, {4, 1, 5, 2, 0, 8, 8, 3});
  TopkResult r = topk(x, targs(2, 1));
  EXPECT_EQ(values(r.indices), (std::vector<double>{2, 0, 1, 2}));
  Tensor dv = f64({2, 2}, {10, 20, 30, 40});
  Tensor dx = topk_backward(x.shape(), dv, r.indices, 1);
  EXPECT_EQ(values(dx), (std::vector<double>{20, 0, 10, 0, 0, 30, 40, 0}));
  // Along axis 0: column maxima 4 (row 0), 8, 8, 3 (row 1).
  TopkResult r0 = topk(x, targs(1, 0));
  Tensor dx0 = topk_backward(x.shape(), f64({1, 4}, {1, 2, 3, 4}), r0.indices, 0);
  EXPECT_EQ(values(dx0), (std::vector<double>{1, 0, 0, 0, 0, 2, 3, 4}));
  Tensor bad = Tensor::from<int64_t>(Shape{2, 2}, std::vector<int64_t>{0, 4, 1, 2});
  EXPECT_THROW(topk_backward(x.shape(), dv, bad, 1), Error);
}

// ---------------- dropout ----------------

DropoutArgs dargs(double p, uint64_t seed, uint64_t stream = 0, bool training = true) {
  return {p, seed, stream, training};
}

// Independent reference: element g of the whole tensor is kept iff its own Philox draw is >= p.
bool kept(const DropoutArgs& a, uint64_t g) { return static_cast<double>(Philox(a.seed, a.stream).uniform(g)) >= a.p; }

TEST(Dropout, WholeTensorMatchesPhiloxAndScales) {
  DropoutArgs a = dargs(0.3, 42, 5);
  Tensor x = lcg({6, 10}, 3);
  DropoutResult r = dropout(x, a);
  ASSERT_EQ(r.mask.dtype(), DType::U8);
  ASSERT_EQ(r.mask.shape(), x.shape());
  int zeros = 0;
  for (int64_t g = 0; g < x.numel(); ++g) {
    bool k = kept(a, static_cast<uint64_t>(g));
    ASSERT_EQ(r.mask.at(g), k ? 1 : 0) << g;
    ASSERT_DOUBLE_EQ(r.out.at(g), k ? x.at(g) / 0.7 : 0.0) << g;
    zeros += k ? 0 : 1;
  }
  EXPECT_GT(zeros, 0);
  // Backward: dx = dy * mask / (1 - p).
  Tensor dy = lcg({6, 10}, 9);
  Tensor dx = dropout_backward(dy, r.mask, a);
  for (int64_t g = 0; g < x.numel(); ++g) ASSERT_DOUBLE_EQ(dx.at(g), r.mask.at(g) ? dy.at(g) / 0.7 : 0.0);
}

TEST(Dropout, ShardByShardMaskEqualsTheWholeMask) {
  DropoutArgs a = dargs(0.3, 1234, 2);
  Shape global{6, 10};
  Tensor x = lcg(global, 17);
  DropoutResult whole = dropout(x, a);
  // 2 x 3 blocks with chunk semantics: rows 3 + 3, columns 4 + 4 + 2.
  const int64_t row_off[2] = {0, 3}, row_len[2] = {3, 3};
  const int64_t col_off[3] = {0, 4, 8}, col_len[3] = {4, 4, 2};
  int64_t covered = 0;
  for (int bi = 0; bi < 2; ++bi) {
    for (int bj = 0; bj < 3; ++bj) {
      std::array<int64_t, 2> off{row_off[bi], col_off[bj]};
      Shape local{row_len[bi], col_len[bj]};
      Tensor block = x.slice(off, local);
      DropoutResult part = dropout(block, global, off, a);
      for (int64_t i = 0; i < local[0]; ++i) {
        for (int64_t j = 0; j < local[1]; ++j) {
          int64_t g = (off[0] + i) * 10 + off[1] + j;
          ASSERT_EQ(part.mask.at(i * local[1] + j), whole.mask.at(g)) << bi << "," << bj << " " << i << "," << j;
          ASSERT_EQ(part.out.at(i * local[1] + j), whole.out.at(g));
          ++covered;
        }
      }
    }
  }
  EXPECT_EQ(covered, 60);
  // A 3-d uneven block and an empty block.
  Shape g3{3, 4, 5};
  Tensor x3 = lcg(g3, 5);
  DropoutResult w3 = dropout(x3, a);
  std::array<int64_t, 3> off3{1, 2, 3};
  DropoutResult p3 = dropout(x3.slice(off3, Shape{2, 2, 2}), g3, off3, a);
  for (int64_t i = 0; i < 8; ++i) {
    int64_t g = (1 + i / 4) * 20 + (2 + (i / 2) % 2) * 5 + 3 + i % 2;
    ASSERT_EQ(p3.mask.at(i), w3.mask.at(g)) << i;
  }
  std::array<int64_t, 3> end{3, 0, 0};
  EXPECT_EQ(dropout(Tensor(DType::F64, Shape{0, 4, 5}), g3, end, a).mask.numel(), 0);
  // A block that does not fit is an Error.
  std::array<int64_t, 2> outside{4, 0};
  EXPECT_THROW(dropout(Tensor(DType::F64, Shape{3, 10}), global, outside, a), Error);
}

TEST(Dropout, KeptFractionIsAboutOneMinusP) {
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    Tensor mask = dropout_mask(Shape{400, 500}, Shape{400, 500}, std::array<int64_t, 2>{0, 0}, dargs(p, 99));
    double kept_count = 0;
    const uint8_t* m = mask.data<uint8_t>();
    for (int64_t i = 0; i < mask.numel(); ++i) kept_count += m[i];
    // 200k Bernoulli draws: the standard deviation of the fraction is < 0.0012.
    EXPECT_NEAR(kept_count / static_cast<double>(mask.numel()), 1.0 - p, 0.006) << "p = " << p;
  }
}

TEST(Dropout, SeedsAndStreamsDiffer) {
  Shape s{1000};
  std::array<int64_t, 1> zero{0};
  Tensor a = dropout_mask(s, s, zero, dargs(0.5, 1, 0));
  Tensor b = dropout_mask(s, s, zero, dargs(0.5, 1, 1));
  Tensor c = dropout_mask(s, s, zero, dargs(0.5, 2, 0));
  int diff_stream = 0, diff_seed = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    diff_stream += a.at(i) != b.at(i);
    diff_seed += a.at(i) != c.at(i);
  }
  EXPECT_GT(diff_stream, 300);
  EXPECT_GT(diff_seed, 300);
}

TEST(Dropout, PZeroEvalModeAndErrors) {
  Tensor x = lcg({5, 7}, 1);
  DropoutResult r = dropout(x, dargs(0.0, 3));
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(r.mask.at(i), 1);
    ASSERT_EQ(r.out.at(i), x.at(i));
  }
  DropoutResult e = dropout(x, dargs(0.7, 3, 0, false));
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(e.mask.at(i), 1);
    ASSERT_EQ(e.out.at(i), x.at(i));
  }
  Tensor dy = lcg({5, 7}, 2);
  Tensor dx = dropout_backward(dy, e.mask, dargs(0.7, 3, 0, false));
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(dx.at(i), dy.at(i));
  // f32 and NaN propagation (NaN * 0 stays NaN, like x * mask * scale).
  Tensor xf = iota(DType::F32, Shape{64});
  xf.set_at(0, std::numeric_limits<double>::quiet_NaN());
  DropoutResult rf = dropout(xf, dargs(0.5, 8));
  EXPECT_EQ(rf.out.dtype(), DType::F32);
  EXPECT_TRUE(std::isnan(rf.out.at(0)));
  for (int64_t i = 1; i < 64; ++i) ASSERT_FLOAT_EQ(static_cast<float>(rf.out.at(i)), rf.mask.at(i) ? 2.0f * i : 0.0f);
  EXPECT_THROW(dropout(x, dargs(1.0, 3)), Error);
  EXPECT_THROW(dropout(x, dargs(-0.1, 3)), Error);
  EXPECT_THROW(dropout(Tensor(DType::I64, Shape{3}), dargs(0.5, 3)), Error);
  EXPECT_THROW(dropout_args(Attrs{{"p", 0.5}}), Error);  // seed is required
  DropoutArgs parsed = dropout_args(Attrs{{"p", 0.25}, {"seed", int64_t{7}}, {"stream", int64_t{2}}});
  EXPECT_EQ(parsed.p, 0.25);
  EXPECT_EQ(parsed.seed, 7u);
  EXPECT_EQ(parsed.stream, 2u);
  EXPECT_TRUE(parsed.training);
  EXPECT_THROW(dropout_args(Attrs{{"p", 1.0}, {"seed", int64_t{7}}}), Error);
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_misc_rules.cc)
namespace rule_tests {
using namespace spmd;
namespace {

using mesh::parse_dist;

// "required inputs | outputs", each list joined by "; ".
std::string show(const SpmdResult& r) {
  std::string s;
  for (size_t i = 0; i < r.inputs.size(); ++i) s += (i ? "; " : "") + r.inputs[i].to_string();
  s += " | ";
  for (size_t i = 0; i < r.outputs.size(); ++i) s += (i ? "; " : "") + r.outputs[i].to_string();
  return s;
}

struct T {
  Shape shape;
  DType dtype;
  std::string dist;
};

std::vector<TensorSpec> specs(const ProcessMesh& mesh, const std::vector<T>& ts) {
  std::vector<TensorSpec> out;
  for (const T& t : ts) out.push_back({t.shape, t.dtype, parse_dist(t.dist, mesh.ndim())});
  return out;
}

std::string fwd(std::string_view rule, const ProcessMesh& mesh, const std::vector<T>& in, const Attrs& attrs) {
  return show(op_registry().rule(rule).forward(mesh, specs(mesh, in), attrs));
}
std::string rev(std::string_view rule, const ProcessMesh& mesh, const std::vector<T>& in, const std::vector<T>& out,
                const Attrs& attrs) {
  return show(op_registry().rule(rule).reverse(mesh, specs(mesh, in), specs(mesh, out), attrs));
}
std::string grad(std::string_view rule, const ProcessMesh& mesh, const std::vector<T>& in, const Attrs& attrs) {
  return show(op_registry().rule(rule).grad(mesh, specs(mesh, in), attrs));
}

const DType F = DType::F64, U8 = DType::U8, I = DType::I64;
const ProcessMesh m1(Shape{2});
const ProcessMesh m2(Shape{2, 3});

Attrs drop() { return Attrs{{"p", 0.3}, {"seed", int64_t{1}}}; }
Attrs axis(int64_t a) { return Attrs{{"axis", a}}; }

TEST(MiscRules, RegisteredWithSummaries) {
  for (const char* name : {"dropout", "cumsum", "arg_reduce", "topk"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "misc") << name;
      }
    }
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(MiscRules, DropoutKeepsShardsAndEveryPartial) {
  EXPECT_EQ(fwd("dropout", m2, {{{12, 6}, F, "S(0),S(1)"}}, drop()), "S(0),S(1) | S(0),S(1); S(0),S(1)");
  EXPECT_EQ(fwd("dropout", m2, {{{12, 6}, F, "S(1)@1,S(1)@0"}}, drop()),
            "S(1)@1,S(1)@0 | S(1)@1,S(1)@0; S(1)@1,S(1)@0");
  EXPECT_EQ(fwd("dropout", m2, {{{5, 7}, F, "P(sum),S(0)"}}, drop()), "P(sum),S(0) | P(sum),S(0); R,S(0)");
  EXPECT_EQ(fwd("dropout", m2, {{{5, 7}, F, "P(max),P(min)"}}, drop()), "P(max),P(min) | P(max),P(min); R,R");
  EXPECT_EQ(fwd("dropout", m1, {{{5, 7}, F, "P(avg)"}}, drop()), "P(avg) | P(avg); R");
}

TEST(MiscRules, DropoutReverseAndGrad) {
  // Wanted out S(0), mask S(1) on another mesh dim: both kept.
  EXPECT_EQ(rev("dropout", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "S(0),R"}, {{12, 6}, U8, "R,S(1)"}}, drop()),
            "S(0),S(1) | S(0),S(1); S(0),S(1)");
  // A wanted Partial out is made by a Partial x; the mask is R there.
  EXPECT_EQ(rev("dropout", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "P(sum),R"}, {{12, 6}, U8, "R,R"}}, drop()),
            "P(sum),R | P(sum),R; R,R");
  // Out wins a mesh dim both claim differently.
  EXPECT_EQ(rev("dropout", m1, {{{12, 6}, F, "R"}}, {{{12, 6}, F, "S(1)"}, {{12, 6}, U8, "S(0)"}}, drop()),
            "S(1) | S(1); S(1)");
  // grad: x, out, mask, dout, dmask -> dx. x's sharding wins; x, out untouched; dmask like mask.
  EXPECT_EQ(grad("dropout", m2,
                 {{{12, 6}, F, "S(0),P(sum)"},
                  {{12, 6}, F, "S(0),R"},
                  {{12, 6}, U8, "R,R"},
                  {{12, 6}, F, "S(1),P(max)"},
                  {{12, 6}, U8, "P(sum),R"}},
                 drop()),
            "S(0),P(sum); S(0),R; S(0),R; S(0),P(max); S(0),R | S(0),P(max)");
  // dout sharded where x is Partial: dout's shard wins that mesh dim.
  EXPECT_EQ(grad("dropout", m1,
                 {{{12, 6}, F, "P(avg)"}, {{12, 6}, F, "R"}, {{12, 6}, U8, "R"}, {{12, 6}, F, "S(1)"},
                  {{12, 6}, U8, "R"}},
                 drop()),
            "P(avg); R; S(1); S(1); S(1) | S(1)");
}

TEST(MiscRules, CumsumReplicatesTheAxisAndPassesLinearPartials) {
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(1)), "S(0),R | S(0),R");
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(-2)), "R,S(1) | R,S(1)");
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "P(sum),P(avg)"}}, axis(0)), "P(sum),P(avg) | P(sum),P(avg)");
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "P(max),P(min)"}}, axis(0)), "R,R | R,R");
  EXPECT_THROW(fwd("cumsum", m1, {{{12, 6}, F, "R"}}, Attrs{}), Error);
  // Reverse: a wanted shard of the axis cannot be made; P(avg) can.
  EXPECT_EQ(rev("cumsum", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "S(1),P(avg)"}}, axis(1)), "R,P(avg) | R,P(avg)");
  EXPECT_EQ(rev("cumsum", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "S(0),P(max)"}}, axis(1)), "S(0),R | S(0),R");
  // Grad: dx = reverse cumsum(dout); x, out left as given.
  EXPECT_EQ(grad("cumsum", m2, {{{12, 6}, F, "S(1),P(max)"}, {{12, 6}, F, "S(0),R"}, {{12, 6}, F, "S(0),P(sum)"}},
                 axis(1)),
            "S(1),P(max); S(0),R; S(0),P(sum) | S(0),P(sum)");
  EXPECT_EQ(grad("cumsum", m1, {{{12, 6}, F, "S(0)"}, {{12, 6}, F, "R"}, {{12, 6}, F, "P(max)"}}, axis(1)),
            "S(0); R; S(0) | S(0)");
}

TEST(MiscRules, ArgReduceReplicatesTheAxisAndRenumbers) {
  Attrs keep{{"axis", int64_t{0}}, {"keepdim", true}};
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(0)), "R,S(1) | R,S(0)");
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "S(0),S(1)"}}, keep), "R,S(1) | R,S(1)");
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(1)), "S(0),R | S(0),R");
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "P(max),S(0)"}}, axis(1)), "R,S(0) | R,S(0)");
  EXPECT_EQ(rev("arg_reduce", m2, {{{4, 3, 5}, F, "R,R"}}, {{{4, 5}, I, "S(1),P(sum)"}}, axis(1)),
            "S(2),R | S(1),R");
  EXPECT_EQ(rev("arg_reduce", m2, {{{4, 3, 5}, F, "R,R"}}, {{{4, 1, 5}, I, "S(0),S(1)"}},
                Attrs{{"axis", int64_t{1}}, {"keepdim", true}}),
            "S(0),R | S(0),R");
  EXPECT_EQ(grad("arg_reduce", m1, {{{12, 6}, F, "S(0)"}, {{6}, I, "R"}, {{6}, I, "P(sum)"}}, axis(0)),
            "S(0); R; P(sum) | R");
}

TEST(MiscRules, TopkReplicatesTheAxis) {
  Attrs k2{{"k", int64_t{2}}};
  EXPECT_EQ(fwd("topk", m2, {{{12, 6}, F, "S(0),S(1)"}}, k2), "S(0),R | S(0),R; S(0),R");
  EXPECT_EQ(fwd("topk", m2, {{{12, 6}, F, "S(1),P(sum)"}}, Attrs{{"k", int64_t{2}}, {"axis", int64_t{0}}}),
            "S(1),R | S(1),R; S(1),R");
  EXPECT_EQ(rev("topk", m2, {{{12, 6}, F, "R,R"}}, {{{12, 2}, F, "S(1),P(max)"}, {{12, 2}, I, "R,S(0)"}}, k2),
            "R,S(0) | R,S(0); R,S(0)");
  // Grad: x, values, indices, dvalues, dindices -> dx.
  EXPECT_EQ(grad("topk", m2,
                 {{{12, 6}, F, "S(0),P(sum)"},
                  {{12, 2}, F, "P(avg),R"},
                  {{12, 2}, I, "R,R"},
                  {{12, 2}, F, "R,P(max)"},
                  {{12, 2}, I, "P(sum),R"}},
                 k2),
            "S(0),P(sum); P(avg),R; S(0),R; S(0),P(max); S(0),R | S(0),P(max)");
  EXPECT_EQ(grad("topk", m1,
                 {{{12, 6}, F, "S(1)"}, {{12, 2}, F, "R"}, {{12, 2}, I, "R"}, {{12, 2}, F, "S(0)"},
                  {{12, 2}, I, "R"}},
                 k2),
            "S(0); R; S(0); S(0); S(0) | S(0)");
}

}  // namespace
}  // namespace rule_tests

}  // namespace shardwise::ops
