// The binary family: its kernels, SPMD rules and registry entries tested side by side.
//
// Binary elementwise and where kernels: forward against hand-computed values, backward against
// hand values (ties, NaN, where) and central finite differences in f64 with broadcasting.
//
// The broadcasting elementwise rules: explicit expectations for sharding, broadcast dims, every
// Partial pass-through (and the cases that must reshard), reverse and grad.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/binary/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_binary.cc)
namespace kernel_tests {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.at(i));
  return v;
}

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Deterministic values in [lo, hi).
std::vector<double> draw(int64_t n, int seed, double lo, double hi) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(seed + 7);
  for (auto& e : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    e = lo + (hi - lo) * static_cast<double>(s >> 11) / static_cast<double>(1ull << 53);
  }
  return v;
}

TEST(BinaryKernel, ArithmeticWithBroadcast) {
  Tensor x = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor y = f64({3}, {10, 20, 30});
  EXPECT_EQ(values_of(binary(BinaryOp::Add, x, y)), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(values_of(binary(BinaryOp::Subtract, x, y)), (std::vector<double>{-9, -18, -27, -6, -15, -24}));
  EXPECT_EQ(values_of(binary(BinaryOp::Multiply, x, y)), (std::vector<double>{10, 40, 90, 40, 100, 180}));
  EXPECT_EQ(values_of(binary(BinaryOp::Divide, y, x)), (std::vector<double>{10, 10, 10, 2.5, 4, 5}));
  // 2x1 with 1x3: an outer sum.
  Tensor c = f64({2, 1}, {1, 2});
  Tensor r = f64({1, 3}, {10, 20, 30});
  Tensor out = binary(BinaryOp::Add, c, r);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of(out), (std::vector<double>{11, 21, 31, 12, 22, 32}));
  // Scalar with a 3-D tensor.
  Tensor s = Tensor::scalar<double>(2.0);
  Tensor t = f64({2, 1, 2}, {1, 2, 3, 4});
  EXPECT_EQ(values_of(binary(BinaryOp::Pow, t, s)), (std::vector<double>{1, 4, 9, 16}));
}

// f32 arithmetic through the row fast paths (same shapes, a repeated row, a repeated column, a
// scalar, outer products) equals op(a, b) element by element through the broadcast walk, bit
// for bit; add/subtract gradients are dout (shared) or its sums, negated for subtract's y.
TEST(BinaryKernel, F32RowPathsEqualTheElementWalk) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{4, 5, 6}, {4, 5, 6}}, {{4, 5, 6}, {6}}, {{4, 5, 6}, {5, 6}}, {{6}, {4, 5, 6}}, {{4, 1, 6}, {5, 1}},
      {{4, 5, 1}, {1}},       {{}, {3, 2}},     {{4, 5, 6}, {4, 5, 1}}, {{0, 6}, {6}}};
  int seed = 0;
  for (const auto& [xs, ys] : shapes) {
    std::vector<double> xv = draw(xs.numel(), seed++, -3, 3), yv = draw(ys.numel(), seed++, 0.5, 2);
    Tensor x = Tensor::from<float>(xs, std::vector<float>(xv.begin(), xv.end()));
    Tensor y = Tensor::from<float>(ys, std::vector<float>(yv.begin(), yv.end()));
    const Shape out = broadcast_shapes(xs, ys);
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Subtract, BinaryOp::Multiply, BinaryOp::Divide}) {
      Tensor got = binary(op, x, y);
      std::vector<float> want(static_cast<size_t>(out.numel()));
      const float* px = x.data<float>();
      const float* py = y.data<float>();
      broadcast_for_each<2>(out, {xs, ys}, [&](int64_t i, const std::array<int64_t, 2>& o) {
        float a = px[o[0]], b = py[o[1]];
        want[static_cast<size_t>(i)] = op == BinaryOp::Add        ? a + b
                                       : op == BinaryOp::Subtract ? a - b
                                       : op == BinaryOp::Multiply ? a * b
                                                                  : a / b;
      });
      ASSERT_EQ(got.shape(), out);
      EXPECT_EQ(values_of(got), values_of(Tensor::from<float>(out, want))) << binary_op_name(op) << " " << xs.to_string()
                                                                            << " " << ys.to_string();
    }
    std::vector<double> gv = draw(out.numel(), seed++, -1, 1);
    Tensor dout = Tensor::from<float>(out, std::vector<float>(gv.begin(), gv.end()));
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Subtract}) {
      BinaryGrads g = binary_backward(op, x, y, binary(op, x, y), dout);
      EXPECT_EQ(values_of(g.dx), values_of(reduce_to_shape(dout, xs)));
      std::vector<double> dy = values_of(reduce_to_shape(dout, ys));
      if (op == BinaryOp::Subtract) {
        for (double& d : dy) d = -d;
      }
      EXPECT_EQ(values_of(g.dy), dy) << binary_op_name(op);
      if (xs == out) {
        EXPECT_EQ(g.dx.raw(), dout.raw()) << "x's gradient is dout itself, not a copy";
      }
    }
  }
}

TEST(BinaryKernel, MaxMinAndNaN) {
  Tensor x = f64({4}, {1, 5, kNaN, kNaN});
  Tensor y = f64({4}, {3, 2, 4, kNaN});
  auto mx = values_of(binary(BinaryOp::Maximum, x, y));
  EXPECT_EQ(mx[0], 3);
  EXPECT_EQ(mx[1], 5);
  EXPECT_TRUE(std::isnan(mx[2]) && std::isnan(mx[3]));
  auto mn = values_of(binary(BinaryOp::Minimum, y, x));  // NaN on either side propagates
  EXPECT_EQ(mn[0], 1);
  EXPECT_EQ(mn[1], 2);
  EXPECT_TRUE(std::isnan(mn[2]) && std::isnan(mn[3]));
  auto fx = values_of(binary(BinaryOp::Fmax, x, y));
  EXPECT_EQ(fx[0], 3);
  EXPECT_EQ(fx[1], 5);
  EXPECT_EQ(fx[2], 4);  // NaN ignored
  EXPECT_TRUE(std::isnan(fx[3]));
  auto fn = values_of(binary(BinaryOp::Fmin, y, x));
  EXPECT_EQ(fn[0], 1);
  EXPECT_EQ(fn[1], 2);
  EXPECT_EQ(fn[2], 4);
  EXPECT_TRUE(std::isnan(fn[3]));
}

TEST(BinaryKernel, Atan2AndPow) {
  Tensor a = f64({4}, {1, 1, -1, 0});
  Tensor b = f64({4}, {1, -1, 0, 2});
  auto at = values_of(binary(BinaryOp::Atan2, a, b));
  EXPECT_NEAR(at[0], M_PI / 4, 1e-15);
  EXPECT_NEAR(at[1], 3 * M_PI / 4, 1e-15);
  EXPECT_NEAR(at[2], -M_PI / 2, 1e-15);
  EXPECT_EQ(at[3], 0);
  auto pw = values_of(binary(BinaryOp::Pow, f64({3}, {2, 4, 9}), f64({3}, {3, 0.5, -0.5})));
  EXPECT_EQ(pw[0], 8);
  EXPECT_EQ(pw[1], 2);
  EXPECT_NEAR(pw[2], 1.0 / 3.0, 1e-15);
}

TEST(BinaryKernel, IntegersAndBitwise) {
  Tensor x = Tensor::from<int64_t>({3}, {12, -7, 5});
  Tensor y = Tensor::from<int64_t>({3}, {10, 3, -5});
  EXPECT_EQ(values_of(binary(BinaryOp::Add, x, y)), (std::vector<double>{22, -4, 0}));
  EXPECT_EQ(values_of(binary(BinaryOp::Multiply, x, y)), (std::vector<double>{120, -21, -25}));
  EXPECT_EQ(values_of(binary(BinaryOp::Maximum, x, y)), (std::vector<double>{12, 3, 5}));
  EXPECT_EQ(values_of(binary(BinaryOp::Fmin, x, y)), (std::vector<double>{10, -7, -5}));
  EXPECT_EQ(values_of(binary(BinaryOp::BitwiseAnd, x, y)), (std::vector<double>{8, 1, 1}));
  EXPECT_EQ(values_of(binary(BinaryOp::BitwiseOr, x, y)), (std::vector<double>{14, -5, -1}));
  EXPECT_EQ(values_of(binary(BinaryOp::BitwiseXor, x, y)), (std::vector<double>{6, -6, -2}));
  // Integer overflow wraps (two's complement) instead of being undefined.
  Tensor big = Tensor::from<int32_t>({2}, {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()});
  Tensor one = Tensor::from<int32_t>({1}, {1});
  EXPECT_EQ(values_of(binary(BinaryOp::Add, big, one)),
            (std::vector<double>{double(std::numeric_limits<int32_t>::min()), double(std::numeric_limits<int32_t>::min() + 1)}));
  EXPECT_EQ(values_of(binary(BinaryOp::Subtract, big, one))[1], double(std::numeric_limits<int32_t>::max()));
}

TEST(BinaryKernel, BoolBitwise) {
  Tensor p(DType::Bool, {2, 1});
  p.set_at(0, 1);  // [[true], [false]]
  Tensor q(DType::Bool, {2});
  q.set_at(1, 1);  // [false, true]
  EXPECT_EQ(values_of(binary(BinaryOp::BitwiseAnd, p, q)), (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(values_of(binary(BinaryOp::BitwiseOr, p, q)), (std::vector<double>{1, 1, 0, 1}));
  EXPECT_EQ(values_of(binary(BinaryOp::BitwiseXor, p, q)), (std::vector<double>{1, 0, 0, 1}));
  EXPECT_EQ(binary(BinaryOp::BitwiseXor, p, q).dtype(), DType::Bool);
}

TEST(BinaryKernel, F32AndF16) {
  Tensor x = Tensor::from<float>({2}, {1.5f, -2.0f});
  Tensor y = Tensor::from<float>({2}, {0.25f, 4.0f});
  Tensor out = binary(BinaryOp::Divide, x, y);
  EXPECT_EQ(out.dtype(), DType::F32);
  EXPECT_EQ(values_of(out), (std::vector<double>{6.0, -0.5}));
  Tensor h = Tensor::from<f16>({2}, {f16(1.5f), f16(-2.0f)});
  Tensor k = Tensor::from<f16>({1}, {f16(3.0f)});
  Tensor prod = binary(BinaryOp::Multiply, h, k);
  EXPECT_EQ(prod.dtype(), DType::F16);
  EXPECT_EQ(values_of(prod), (std::vector<double>{4.5, -6.0}));
}

TEST(BinaryKernel, EmptyShapes) {
  Tensor x(DType::F64, {0, 3});
  Tensor y = f64({3}, {1, 2, 3});
  Tensor out = binary(BinaryOp::Divide, x, y);
  EXPECT_EQ(out.shape(), (Shape{0, 3}));
  BinaryGrads g = binary_backward(BinaryOp::Multiply, x, y, out, Tensor(DType::F64, {0, 3}));
  EXPECT_EQ(g.dx.shape(), (Shape{0, 3}));
  EXPECT_EQ(values_of(g.dy), (std::vector<double>{0, 0, 0}));
  // Broadcasting against an empty dim gives an empty result.
  EXPECT_EQ(binary(BinaryOp::Add, f64({2, 1}, {1, 2}), Tensor(DType::F64, {0})).shape(), (Shape{2, 0}));
}

TEST(BinaryKernel, DtypeErrors) {
  Tensor a = Tensor::from<float>({2}, {1, 2});
  Tensor b = f64({2}, {1, 2});
  std::string msg = error_of([&] { binary(BinaryOp::Add, a, b); });
  EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  msg = error_of([&] { binary(BinaryOp::BitwiseAnd, b, b); });
  EXPECT_NE(msg.find("bitwise_and"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  Tensor i = Tensor::from<int64_t>({2}, {1, 2});
  msg = error_of([&] { binary(BinaryOp::Divide, i, i); });
  EXPECT_NE(msg.find("i64"), std::string::npos) << msg;
  Tensor t(DType::Bool, {2});
  EXPECT_THROW(binary(BinaryOp::Add, t, t), Error);
  EXPECT_THROW(binary(BinaryOp::Pow, i, i), Error);
  EXPECT_THROW(binary(BinaryOp::BitwiseOr, a, a), Error);
  msg = error_of([&] { binary(BinaryOp::Add, f64({3, 4}, std::vector<double>(12)), f64({5}, std::vector<double>(5))); });
  EXPECT_NE(msg.find("3x4"), std::string::npos) << msg;
  EXPECT_EQ(binary_result_dtype(BinaryOp::Add, DType::I32, DType::I32), DType::I32);
  EXPECT_THROW(binary_result_dtype(BinaryOp::Atan2, DType::I32, DType::I32), Error);
}

// --- backward ---------------------------------------------------------------------------------

TEST(BinaryBackward, HandValuesWithBroadcast) {
  Tensor x = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor y = f64({3}, {10, 20, 30});
  Tensor g = f64({2, 3}, {1, 1, 1, 2, 2, 2});
  Tensor out = binary(BinaryOp::Add, x, y);
  BinaryGrads add = binary_backward(BinaryOp::Add, x, y, out, g);
  EXPECT_EQ(values_of(add.dx), values_of(g));
  EXPECT_EQ(add.dy.shape(), Shape{3});
  EXPECT_EQ(values_of(add.dy), (std::vector<double>{3, 3, 3}));
  BinaryGrads sub = binary_backward(BinaryOp::Subtract, x, y, out, g);
  EXPECT_EQ(values_of(sub.dy), (std::vector<double>{-3, -3, -3}));
  BinaryGrads mul = binary_backward(BinaryOp::Multiply, x, y, out, g);
  EXPECT_EQ(values_of(mul.dx), (std::vector<double>{10, 20, 30, 20, 40, 60}));
  EXPECT_EQ(values_of(mul.dy), (std::vector<double>{1 + 8, 2 + 10, 3 + 12}));
}

TEST(BinaryBackward, MaxMinTiesSplitHalf) {
  // Ties split the gradient half/half; broadcasting sums y's shares.
  Tensor x = f64({3}, {1, 3, 5});
  Tensor y = f64({1}, {3});
  Tensor g = f64({3}, {1, 2, 4});
  for (BinaryOp op : {BinaryOp::Maximum, BinaryOp::Fmax}) {
    BinaryGrads r = binary_backward(op, x, y, binary(op, x, y), g);
    EXPECT_EQ(values_of(r.dx), (std::vector<double>{0, 1, 4}));
    EXPECT_EQ(values_of(r.dy), (std::vector<double>{1 + 1}));
  }
  for (BinaryOp op : {BinaryOp::Minimum, BinaryOp::Fmin}) {
    BinaryGrads r = binary_backward(op, x, y, binary(op, x, y), g);
    EXPECT_EQ(values_of(r.dx), (std::vector<double>{1, 1, 0}));
    EXPECT_EQ(values_of(r.dy), (std::vector<double>{1 + 4}));
  }
}

TEST(BinaryBackward, NaNTakesTheGradientOnlyWhereItIsSelected) {
  Tensor x = f64({2}, {kNaN, 1});
  Tensor y = f64({2}, {2, kNaN});
  Tensor g = f64({2}, {1, 1});
  BinaryGrads m = binary_backward(BinaryOp::Maximum, x, y, binary(BinaryOp::Maximum, x, y), g);
  EXPECT_EQ(values_of(m.dx), (std::vector<double>{1, 0}));  // maximum propagates the NaN operand
  EXPECT_EQ(values_of(m.dy), (std::vector<double>{0, 1}));
  BinaryGrads f = binary_backward(BinaryOp::Fmax, x, y, binary(BinaryOp::Fmax, x, y), g);
  EXPECT_EQ(values_of(f.dx), (std::vector<double>{0, 1}));  // fmax selects the non-NaN operand
  EXPECT_EQ(values_of(f.dy), (std::vector<double>{1, 0}));
}

TEST(BinaryBackward, PowAtZero) {
  Tensor x = f64({3}, {0, 0, 2});
  Tensor y = f64({3}, {2, 0, 0});
  Tensor g = f64({3}, {1, 1, 1});
  BinaryGrads r = binary_backward(BinaryOp::Pow, x, y, binary(BinaryOp::Pow, x, y), g);
  // d/dx x^2 at 0 = 0; d/dx x^0 = 0; d/dy 0^y (y >= 0) masked to 0; d/dy 2^0 = ln 2.
  EXPECT_EQ(values_of(r.dx), (std::vector<double>{0, 0, 0}));
  auto dy = values_of(r.dy);
  EXPECT_EQ(dy[0], 0);
  EXPECT_EQ(dy[1], 0);
  EXPECT_NEAR(dy[2], std::log(2.0), 1e-15);
}

TEST(BinaryBackward, IntegerAndBitwiseHaveNoGradient) {
  Tensor i = Tensor::from<int64_t>({2}, {1, 2});
  BinaryGrads r = binary_backward(BinaryOp::Add, i, i, i, i);
  EXPECT_FALSE(r.dx.defined());
  EXPECT_FALSE(r.dy.defined());
  EXPECT_FALSE(binary_op_has_gradient(BinaryOp::BitwiseXor));
  EXPECT_THROW(binary_backward(BinaryOp::BitwiseAnd, i, i, i, i), Error);
  // A wrongly shaped output gradient is an Error naming the expected shape.
  Tensor x = f64({2, 3}, std::vector<double>(6, 1.0));
  std::string msg = error_of([&] { binary_backward(BinaryOp::Add, x, x, x, f64({3}, {1, 2, 3})); });
  EXPECT_NE(msg.find("2x3"), std::string::npos) << msg;
}

// Central finite differences of L = sum(w * op(x, y)) with respect to every element of x and y.
struct FdCase {
  BinaryOp op;
  Shape xs, ys;
  double xlo, xhi, ylo, yhi;
};

void check_fd(const FdCase& c, int seed) {
  Tensor x = f64(c.xs, draw(c.xs.numel(), seed, c.xlo, c.xhi));
  Tensor y = f64(c.ys, draw(c.ys.numel(), seed + 1, c.ylo, c.yhi));
  Tensor out = binary(c.op, x, y);
  Tensor w = f64(out.shape(), draw(out.numel(), seed + 2, -1.5, 1.5));
  auto loss = [&](const Tensor& a, const Tensor& b) {
    Tensor o = binary(c.op, a, b);
    double s = 0;
    for (int64_t i = 0; i < o.numel(); ++i) s += o.at(i) * w.at(i);
    return s;
  };
  BinaryGrads g = binary_backward(c.op, x, y, out, w);
  ASSERT_EQ(g.dx.shape(), c.xs);
  ASSERT_EQ(g.dy.shape(), c.ys);
  const double h = 1e-6;
  for (int which = 0; which < 2; ++which) {
    const Tensor& base = which == 0 ? x : y;
    const Tensor& grad = which == 0 ? g.dx : g.dy;
    for (int64_t i = 0; i < base.numel(); ++i) {
      Tensor plus = base.clone(), minus = base.clone();
      plus.set_at(i, base.at(i) + h);
      minus.set_at(i, base.at(i) - h);
      double fd = which == 0 ? (loss(plus, y) - loss(minus, y)) / (2 * h) : (loss(x, plus) - loss(x, minus)) / (2 * h);
      EXPECT_NEAR(grad.at(i), fd, 1e-6 * (1 + std::fabs(fd)))
          << binary_op_name(c.op) << " d" << (which == 0 ? "x" : "y") << "[" << i << "] for " << c.xs.to_string()
          << " with " << c.ys.to_string();
    }
  }
}

TEST(BinaryBackward, FiniteDifferences) {
  std::vector<Shape> xs = {{3, 4}, {3, 1}, {2, 3, 4}, {4}};
  std::vector<Shape> ys = {{3, 4}, {1, 4}, {3, 1}, {2, 3, 4}};
  int seed = 0;
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Subtract, BinaryOp::Multiply, BinaryOp::Divide, BinaryOp::Maximum,
                      BinaryOp::Minimum, BinaryOp::Fmax, BinaryOp::Fmin, BinaryOp::Atan2, BinaryOp::Pow}) {
    for (size_t k = 0; k < xs.size(); ++k) {
      // Positive divisors and bases; random reals never tie, so max/min are differentiable here.
      bool pos_x = op == BinaryOp::Pow, pos_y = op == BinaryOp::Divide;
      check_fd({op, xs[k], ys[k], pos_x ? 0.5 : -2.0, 2.0, pos_y ? 0.5 : -2.0, 2.0}, seed += 3);
    }
  }
}

// --- where -------------------------------------------------------------------------------------

Tensor bools(const Shape& s, std::vector<int> v) {
  Tensor t(DType::Bool, s);
  for (size_t i = 0; i < v.size(); ++i) t.set_at(static_cast<int64_t>(i), v[i]);
  return t;
}

TEST(WhereKernel, ForwardBroadcastsAllThree) {
  Tensor cond = bools({3}, {1, 0, 1});
  Tensor x = f64({2, 1}, {10, 20});
  Tensor y = Tensor::scalar<double>(-1.0);
  Tensor out = where(cond, x, y);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(values_of(out), (std::vector<double>{10, -1, 10, 20, -1, 20}));
  Tensor bx = bools({2}, {1, 1}), by = bools({2}, {0, 0});
  EXPECT_EQ(values_of(where(bools({2}, {1, 0}), bx, by)), (std::vector<double>{1, 0}));
  Tensor ix = Tensor::from<int32_t>({2}, {7, 8}), iy = Tensor::from<int32_t>({1}, {-3});
  EXPECT_EQ(values_of(where(bools({2}, {0, 1}), ix, iy)), (std::vector<double>{-3, 8}));
}

TEST(WhereKernel, BackwardRoutesAndSums) {
  Tensor cond = bools({3}, {1, 0, 1});
  Tensor x = f64({2, 1}, {10, 20});
  Tensor y = f64({1}, {-1});
  Tensor g = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  BinaryGrads r = where_backward(cond, x, y, g);
  EXPECT_EQ(r.dx.shape(), (Shape{2, 1}));
  EXPECT_EQ(values_of(r.dx), (std::vector<double>{1 + 3, 4 + 6}));
  EXPECT_EQ(values_of(r.dy), (std::vector<double>{2 + 5}));
  Tensor ix = Tensor::from<int32_t>({2}, {7, 8});
  EXPECT_FALSE(where_backward(bools({2}, {0, 1}), ix, ix, ix).dx.defined());
}

TEST(WhereKernel, Errors) {
  Tensor x = f64({2}, {1, 2});
  std::string msg = error_of([&] { where(x, x, x); });
  EXPECT_NE(msg.find("bool"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  msg = error_of([&] { where(bools({2}, {1, 0}), x, Tensor::from<float>({2}, {1, 2})); });
  EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
  EXPECT_THROW(where(bools({3}, {1, 0, 1}), x, x), Error);
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_binary_rules.cc)
namespace rule_tests {
using namespace spmd;
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
  return strings(op_registry().rule(rule).forward(mesh, specs, {}));
}

TEST(BinaryRules, Registered) {
  for (const char* name : {"elementwise_add", "elementwise_multiply", "elementwise_divide", "elementwise_max",
                           "elementwise_min", "elementwise_binary", "elementwise_where"}) {
    const Rule* r = &op_registry().rule(name);
    ASSERT_NE(r, nullptr) << name;
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "binary") << name;
      }
    }
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
  return strings(op_registry().rule("elementwise_where").forward(mesh, specs, {}));
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
    return strings(op_registry().rule(rule).reverse(mesh, ins, outs, {}));
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
  return strings(op_registry().rule(rule).grad(mesh, specs, {}));
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
  const Rule& add = op_registry().rule("elementwise_add");
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
}  // namespace rule_tests

}  // namespace shardwise::ops
