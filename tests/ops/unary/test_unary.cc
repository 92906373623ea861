// The unary family: its kernels, SPMD rules and registry entries tested side by side.
//
// Unary kernels against independent references: hand-computed values, <cmath> on doubles, and
// central finite differences in f64 for the backward kernels.
//
// Explicit expectations for the unary elementwise rules (the verifier proves them numerically).
//
// The unary op registry entries: names, rules, shape/dtype inference, kernels and case coverage.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/unary/kernels.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_unary.cc)
namespace kernel_tests {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor f64(std::vector<double> v) { return Tensor::from<double>(Shape{static_cast<int64_t>(v.size())}, v); }

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.at(i));
  return out;
}

// The reference: the textbook formula on doubles, written independently of the kernel.
double reference(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::Abs: return std::fabs(x);
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Rsqrt: return std::pow(x, -0.5);
    case UnaryOp::Reciprocal: return std::pow(x, -1.0);
    case UnaryOp::Sin: return std::sin(x);
    case UnaryOp::Cos: return std::cos(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::Relu: return std::max(x, 0.0);
    case UnaryOp::Gelu: {
      const double pi = std::acos(-1.0);
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * std::pow(x, 3))));
    }
    case UnaryOp::Silu: return x / (1.0 + std::exp(-x));
    case UnaryOp::Square: return std::pow(x, 2);
    case UnaryOp::Sign: return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0);
  }
  return kNaN;
}

bool positive_domain(UnaryOp op) {
  return op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Reciprocal;
}

// Points away from the kinks (0 for abs, relu, sign), inside every op's domain.
std::vector<double> sample_points(UnaryOp op) {
  if (positive_domain(op)) return {0.5, 0.73, 1.0, 1.37, 2.0, 3.5};
  return {-2.5, -1.3, -0.4, 0.3, 0.9, 1.7, 3.1};
}

TEST(UnaryKernel, ForwardMatchesCmathInF64AndF32) {
  for (UnaryOp op : kAllUnaryOps) {
    std::vector<double> xs = sample_points(op);
    Tensor y64 = unary(op, f64(xs));
    Tensor y32 = unary(op, f64(xs).to(DType::F32));
    ASSERT_EQ(y64.dtype(), DType::F64);
    ASSERT_EQ(y32.dtype(), DType::F32);
    for (size_t i = 0; i < xs.size(); ++i) {
      double want = reference(op, xs[i]);
      auto idx = static_cast<int64_t>(i);
      EXPECT_NEAR(y64.at(idx), want, 1e-13 * (1 + std::fabs(want))) << unary_op_name(op) << "(" << xs[i] << ")";
      EXPECT_NEAR(y32.at(idx), want, 2e-6 * (1 + std::fabs(want))) << unary_op_name(op) << "(" << xs[i] << ")";
    }
  }
}

TEST(UnaryKernel, SixteenBitFloatsComputeInFloat) {
  for (UnaryOp op : kAllUnaryOps) {
    std::vector<double> xs = sample_points(op);
    for (DType dt : {DType::F16, DType::BF16}) {
      Tensor y = unary(op, f64(xs).to(dt));
      ASSERT_EQ(y.dtype(), dt);
      double tol = dt == DType::F16 ? 2e-3 : 1.6e-2;  // input rounding + one output rounding
      for (size_t i = 0; i < xs.size(); ++i) {
        double x = f64({xs[i]}).to(dt).at(0);  // the rounded input the kernel sees
        double want = reference(op, x);
        EXPECT_NEAR(y.at(static_cast<int64_t>(i)), want, tol * (1 + std::fabs(want))) << unary_op_name(op);
      }
    }
  }
}

TEST(UnaryKernel, HandComputedValues) {
  // GELU (tanh approximation) at 1 and -1: 0.5 (1 + tanh(0.7978845608 * 1.044715)) = 0.841192.
  Tensor g = unary(UnaryOp::Gelu, f64({1.0, -1.0, 0.0}));
  EXPECT_NEAR(g.at(0), 0.8411919906, 1e-9);
  EXPECT_NEAR(g.at(1), -0.1588080094, 1e-9);
  EXPECT_EQ(g.at(2), 0.0);
  EXPECT_EQ(unary(UnaryOp::Sigmoid, f64({0.0})).at(0), 0.5);
  EXPECT_EQ(unary(UnaryOp::Silu, f64({0.0})).at(0), 0.0);
  EXPECT_EQ(values_of(unary(UnaryOp::Relu, f64({-1.5, 0.0, 2.0}))), (std::vector<double>{0.0, 0.0, 2.0}));
  EXPECT_EQ(values_of(unary(UnaryOp::Sign, f64({-3.0, 0.0, 0.25}))), (std::vector<double>{-1.0, 0.0, 1.0}));
  EXPECT_EQ(values_of(unary(UnaryOp::Rsqrt, f64({4.0, 0.25}))), (std::vector<double>{0.5, 2.0}));
  // Sigmoid stays finite and exact at the extremes (no exp overflow).
  Tensor s = unary(UnaryOp::Sigmoid, f64({-800.0, 800.0}));
  EXPECT_EQ(s.at(0), 0.0);
  EXPECT_EQ(s.at(1), 1.0);
}

TEST(UnaryKernel, NanAndDomainEdges) {
  Tensor nan = f64({kNaN});
  EXPECT_TRUE(std::isnan(unary(UnaryOp::Relu, nan).at(0)));  // relu keeps NaN, like PyTorch
  EXPECT_EQ(unary(UnaryOp::Sign, nan).at(0), 0.0);            // sign(NaN) = 0, like PyTorch
  EXPECT_TRUE(std::isnan(unary(UnaryOp::Log, f64({-1.0})).at(0)));
  EXPECT_EQ(unary(UnaryOp::Log, f64({0.0})).at(0), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(unary(UnaryOp::Reciprocal, f64({0.0})).at(0), std::numeric_limits<double>::infinity());
}

// Central differences in f64: (f(x + h) - f(x - h)) / 2h, on the reference formula.
double numeric_derivative(UnaryOp op, double x) {
  const double h = 1e-6;
  return (reference(op, x + h) - reference(op, x - h)) / (2 * h);
}

TEST(UnaryKernel, BackwardMatchesFiniteDifferences) {
  for (UnaryOp op : kAllUnaryOps) {
    std::vector<double> xs = sample_points(op);
    std::vector<double> dys;
    for (size_t i = 0; i < xs.size(); ++i) dys.push_back(0.5 + 0.25 * static_cast<double>(i));
    Tensor x = f64(xs);
    Tensor dx = unary_backward(op, x, unary(op, x), f64(dys));
    ASSERT_TRUE(dx.defined());
    ASSERT_EQ(dx.dtype(), DType::F64);
    for (size_t i = 0; i < xs.size(); ++i) {
      double want = dys[i] * numeric_derivative(op, xs[i]);
      EXPECT_NEAR(dx.at(static_cast<int64_t>(i)), want, 1e-7 * (1 + std::fabs(want)))
          << unary_op_name(op) << "'(" << xs[i] << ")";
    }
  }
}

TEST(UnaryKernel, BackwardF32IsCloseToF64) {
  for (UnaryOp op : kAllUnaryOps) {
    Tensor x = f64(sample_points(op));
    Tensor dy = Tensor::full(DType::F64, x.shape(), 1.25);
    Tensor want = unary_backward(op, x, unary(op, x), dy);
    Tensor x32 = x.to(DType::F32);
    Tensor got = unary_backward(op, x32, unary(op, x32), dy.to(DType::F32));
    ASSERT_EQ(got.dtype(), DType::F32);
    EXPECT_TRUE(compare(got.to(DType::F64), want, 1e-5, 1e-6).equal) << unary_op_name(op);
  }
}

TEST(UnaryKernel, GradientsAtNonDifferentiablePointsFollowPyTorch) {
  Tensor x = f64({0.0, 0.0});
  Tensor dy = f64({3.0, -2.0});
  EXPECT_EQ(values_of(unary_backward(UnaryOp::Abs, x, unary(UnaryOp::Abs, x), dy)), (std::vector<double>{0, 0}));
  EXPECT_EQ(values_of(unary_backward(UnaryOp::Relu, x, unary(UnaryOp::Relu, x), dy)), (std::vector<double>{0, 0}));
  Tensor xs = f64({-1.0, 2.0});
  EXPECT_EQ(values_of(unary_backward(UnaryOp::Sign, xs, unary(UnaryOp::Sign, xs), dy)), (std::vector<double>{0, 0}));
  EXPECT_EQ(values_of(unary_backward(UnaryOp::Abs, xs, unary(UnaryOp::Abs, xs), dy)), (std::vector<double>{-3, -2}));
  EXPECT_EQ(values_of(unary_backward(UnaryOp::Neg, xs, Tensor(), dy)), (std::vector<double>{-3, 2}));
}

TEST(UnaryKernel, IntegerOpsWrapAround) {
  auto i8 = [](std::vector<int8_t> v) { return Tensor::from<int8_t>(Shape{static_cast<int64_t>(v.size())}, v); };
  Tensor x = i8({-128, -5, 0, 7, 16, 127});
  EXPECT_EQ(values_of(unary(UnaryOp::Abs, x)), (std::vector<double>{-128, 5, 0, 7, 16, 127}));
  EXPECT_EQ(values_of(unary(UnaryOp::Neg, x)), (std::vector<double>{-128, 5, 0, -7, -16, -127}));
  // 16^2 = 256 = 0 (mod 256); 127^2 = 16129 = 63 * 256 + 1.
  EXPECT_EQ(values_of(unary(UnaryOp::Square, x)), (std::vector<double>{0, 25, 0, 49, 0, 1}));
  EXPECT_EQ(values_of(unary(UnaryOp::Sign, x)), (std::vector<double>{-1, -1, 0, 1, 1, 1}));
  EXPECT_EQ(unary(UnaryOp::Neg, x).dtype(), DType::I8);

  Tensor u = Tensor::from<uint8_t>(Shape{3}, std::vector<uint8_t>{0, 1, 200});
  EXPECT_EQ(values_of(unary(UnaryOp::Neg, u)), (std::vector<double>{0, 255, 56}));
  EXPECT_EQ(values_of(unary(UnaryOp::Abs, u)), (std::vector<double>{0, 1, 200}));
  EXPECT_EQ(values_of(unary(UnaryOp::Sign, u)), (std::vector<double>{0, 1, 1}));

  Tensor big = Tensor::from<int64_t>(Shape{2}, std::vector<int64_t>{-3000000000LL, 3037000500LL});
  Tensor sq = unary(UnaryOp::Square, big);
  EXPECT_EQ(sq.data<int64_t>()[0], 9000000000000000000LL);
  // 3037000500^2 = 9223372037000250000 = 2^63 + 145474192 wraps to -2^63 + 145474192.
  EXPECT_EQ(sq.data<int64_t>()[1], std::numeric_limits<int64_t>::min() + 145474192LL);

  Tensor i32 = Tensor::from<int32_t>(Shape{2}, std::vector<int32_t>{-4, 9});
  EXPECT_FALSE(unary_backward(UnaryOp::Abs, i32, unary(UnaryOp::Abs, i32), i32).defined());
}

TEST(UnaryKernel, UnsupportedDtypesAreErrors) {
  Tensor i = Tensor::from<int32_t>(Shape{2}, std::vector<int32_t>{1, 2});
  EXPECT_THROW(unary(UnaryOp::Exp, i), Error);
  EXPECT_THROW(unary(UnaryOp::Relu, i), Error);
  Tensor b = Tensor::full(DType::Bool, Shape{1}, 1);
  EXPECT_THROW(unary(UnaryOp::Abs, b), Error);
  try {
    unary(UnaryOp::Log, i);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("log"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(unary_supports(UnaryOp::Square, DType::U8));
  EXPECT_FALSE(unary_supports(UnaryOp::Sin, DType::I64));
}

TEST(UnaryKernel, EmptyTensors) {
  Tensor x(DType::F64, Shape{0, 3});
  for (UnaryOp op : kAllUnaryOps) {
    Tensor y = unary(op, x);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(unary_backward(op, x, y, x).shape(), x.shape());
  }
  EXPECT_EQ(scale(x, 2, 1, true).numel(), 0);
  EXPECT_EQ(cast(x, DType::I8).shape(), x.shape());
}

TEST(ScaleKernel, BothBiasOrders) {
  Tensor x = f64({-1.0, 0.0, 2.5});
  EXPECT_EQ(values_of(scale(x, 2.0, 1.0, true)), (std::vector<double>{-1.0, 1.0, 6.0}));    // 2x + 1
  EXPECT_EQ(values_of(scale(x, 2.0, 1.0, false)), (std::vector<double>{0.0, 2.0, 7.0}));    // 2(x + 1)
  EXPECT_EQ(values_of(scale(x, -0.5, 0.0, true)), (std::vector<double>{0.5, -0.0, -1.25}));
  Tensor x32 = scale(x.to(DType::F32), 3.0, -0.5, true);
  EXPECT_EQ(x32.dtype(), DType::F32);
  EXPECT_EQ(values_of(x32), (std::vector<double>{-3.5, -0.5, 7.0}));
  EXPECT_EQ(values_of(scale_backward(f64({1.0, -4.0}), -2.5)), (std::vector<double>{-2.5, 10.0}));
}

TEST(ScaleKernel, Integers) {
  Tensor x = Tensor::from<int32_t>(Shape{3}, std::vector<int32_t>{-2, 0, 5});
  Tensor y = scale(x, 3, -1, true);
  EXPECT_EQ(y.dtype(), DType::I32);
  EXPECT_EQ(values_of(y), (std::vector<double>{-7, -1, 14}));
  EXPECT_EQ(values_of(scale(x, -2, 1, false)), (std::vector<double>{2, -2, -12}));
  Tensor u = Tensor::from<uint8_t>(Shape{2}, std::vector<uint8_t>{100, 200});
  EXPECT_EQ(values_of(scale(u, 3, 0, true)), (std::vector<double>{44, 88}));  // 300, 600 mod 256
  EXPECT_THROW(scale(x, 0.5, 0, true), Error);
  EXPECT_THROW(scale(x, 1, 0.25, true), Error);
  EXPECT_THROW(scale(Tensor::full(DType::Bool, Shape{1}, 1), 1, 0, true), Error);
  EXPECT_FALSE(scale_backward(x, 2).defined());
}

TEST(CastKernel, FloatToIntegerTruncatesAndSaturates) {
  Tensor x = f64({-300.7, -1.5, -0.0, 0.4, 1.0, 2.5, 127.9, 300.0, kNaN, 1e30, -1e30});
  EXPECT_EQ(values_of(cast(x, DType::I8)), (std::vector<double>{-128, -1, 0, 0, 1, 2, 127, 127, 0, 127, -128}));
  EXPECT_EQ(values_of(cast(x, DType::U8)), (std::vector<double>{0, 0, 0, 0, 1, 2, 127, 255, 0, 255, 0}));
  EXPECT_EQ(values_of(cast(x, DType::I32)),
            (std::vector<double>{-300, -1, 0, 0, 1, 2, 127, 300, 0, 2147483647.0, -2147483648.0}));
  Tensor i64 = cast(x, DType::I64);
  EXPECT_EQ(i64.data<int64_t>()[9], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64.data<int64_t>()[10], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(values_of(cast(x, DType::Bool)), (std::vector<double>{1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(CastKernel, IntegerToIntegerWraps) {
  Tensor x = Tensor::from<int64_t>(Shape{4}, std::vector<int64_t>{300, -300, 200, -1});
  EXPECT_EQ(values_of(cast(x, DType::I8)), (std::vector<double>{44, -44, -56, -1}));
  EXPECT_EQ(values_of(cast(x, DType::U8)), (std::vector<double>{44, 212, 200, 255}));
  Tensor u = Tensor::from<uint8_t>(Shape{2}, std::vector<uint8_t>{200, 7});
  EXPECT_EQ(values_of(cast(u, DType::I8)), (std::vector<double>{-56, 7}));
  EXPECT_EQ(values_of(cast(u, DType::I64)), (std::vector<double>{200, 7}));
}

TEST(CastKernel, FloatRounding) {
  Tensor x = f64({0.1, 1.0 / 3.0, 65520.0, 1e-8});
  Tensor y = cast(x, DType::F32);
  EXPECT_EQ(y.data<float>()[0], 0.1f);
  EXPECT_EQ(y.data<float>()[1], 1.0f / 3.0f);
  Tensor h = cast(x, DType::F16);
  EXPECT_EQ(h.at(2), std::numeric_limits<double>::infinity());  // above f16's max 65504 (+ half ulp)
  EXPECT_NEAR(h.at(1), 0.333251953125, 0);                      // nearest f16 to 1/3
  Tensor b = cast(x, DType::BF16);
  EXPECT_EQ(b.at(0), 0.10009765625);  // nearest bf16 to 0.1
}

TEST(CastKernel, EveryPairOnSmallValues) {
  // 0, 1, 2, 5 are exact in every dtype (bool: nonzero -> 1).
  std::vector<double> v = {0, 1, 2, 5};
  for (DType src : kAllDTypes) {
    Tensor x(src, Shape{4});
    for (int64_t i = 0; i < 4; ++i) x.set_at(i, src == DType::Bool ? (v[static_cast<size_t>(i)] != 0) : v[static_cast<size_t>(i)]);
    for (DType dst : kAllDTypes) {
      Tensor y = cast(x, dst);
      ASSERT_EQ(y.dtype(), dst);
      for (int64_t i = 0; i < 4; ++i) {
        double want = x.at(i);
        if (dst == DType::Bool) want = want != 0;
        EXPECT_EQ(y.at(i), want) << dtype_name(src) << " -> " << dtype_name(dst) << " element " << i;
      }
    }
  }
}

TEST(CastKernel, Backward) {
  Tensor dy = Tensor::from<float>(Shape{2}, std::vector<float>{0.5f, -2.0f});
  Tensor dx = cast_backward(dy, DType::F64);
  EXPECT_EQ(dx.dtype(), DType::F64);
  EXPECT_EQ(values_of(dx), (std::vector<double>{0.5, -2.0}));
  EXPECT_FALSE(cast_backward(dy, DType::I32).defined());
  EXPECT_FALSE(cast_backward(dy, DType::Bool).defined());
  Tensor from_int = cast_backward(Tensor::from<int32_t>(Shape{1}, std::vector<int32_t>{3}), DType::F32);
  EXPECT_EQ(from_int.dtype(), DType::F32);
  EXPECT_EQ(from_int.at(0), 3.0);
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_unary_rules.cc)
namespace rule_tests {
using namespace spmd;
namespace {

using mesh::parse_dist;

ProcessMesh mesh_of(std::initializer_list<int64_t> dims) { return ProcessMesh(Shape(dims)); }

TensorSpec spec(Shape shape, std::string_view dist, DType dtype = DType::F64) {
  return TensorSpec{shape, dtype, parse_dist(dist)};
}

struct Forward {
  std::string in, out;
};
Forward forward(std::string_view rule, const ProcessMesh& m, const TensorSpec& x, const Attrs& attrs = {}) {
  std::vector<TensorSpec> inputs = {x};
  SpmdResult r = op_registry().rule(rule).forward(m, inputs, attrs);
  EXPECT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return {r.inputs[0].to_string(), r.outputs[0].to_string()};
}

Forward reverse(std::string_view rule, const ProcessMesh& m, const TensorSpec& x, const TensorSpec& wanted,
                const Attrs& attrs = {}) {
  std::vector<TensorSpec> inputs = {x}, outputs = {wanted};
  SpmdResult r = op_registry().rule(rule).reverse(m, inputs, outputs, attrs);
  EXPECT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return {r.inputs[0].to_string(), r.outputs[0].to_string()};
}

// Grad: returns "x | out | dy -> dx".
std::string grad(std::string_view rule, const ProcessMesh& m, const TensorSpec& x, const TensorSpec& out,
                 const TensorSpec& dy, const Attrs& attrs = {}) {
  std::vector<TensorSpec> g = {x, out, dy};
  SpmdResult r = op_registry().rule(rule).grad(m, g, attrs);
  EXPECT_EQ(r.inputs.size(), 3u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return r.inputs[0].to_string() + " | " + r.inputs[1].to_string() + " | " + r.inputs[2].to_string() + " -> " +
         r.outputs[0].to_string();
}

Attrs scale_attrs(double s, double b, bool after = true) {
  return Attrs{{"scale", s}, {"bias", b}, {"bias_after_scale", after}};
}
Attrs cast_to(const char* dtype) { return Attrs{{"dtype", std::string(dtype)}}; }

const ProcessMesh k2 = mesh_of({2});
const ProcessMesh k22 = mesh_of({2, 2});
const ProcessMesh k23 = mesh_of({2, 3});

TEST(UnaryRules, AllRegisteredInTheUnaryFamily) {
  for (const char* name : {"elementwise_unary", "elementwise_unary_monotone", "neg", "scale", "cast"}) {
    const Rule* r = &op_registry().rule(name);
    ASSERT_NE(r, nullptr) << name;
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "unary") << name;
      }
    }
    EXPECT_FALSE(r->summary.empty());
  }
}

TEST(UnaryRules, NonLinearKeepsShardsAndReplicatesPartials) {
  Forward f = forward("elementwise_unary", k22, spec({12, 6}, "S(1),P(sum)"));
  EXPECT_EQ(f.in, "S(1),R");
  EXPECT_EQ(f.out, "S(1),R");
  for (const char* p : {"P(sum)", "P(avg)", "P(max)", "P(min)"}) {
    Forward g = forward("elementwise_unary", k2, spec({12}, p));
    EXPECT_EQ(g.in, "R") << p;
    EXPECT_EQ(g.out, "R") << p;
  }
  // The co-shard order is kept: mesh dim 1 splits dim 0 first, then mesh dim 0.
  Forward c = forward("elementwise_unary", k23, spec({12, 6}, "S(0)@1,S(0)@0"));
  EXPECT_EQ(c.in, "S(0)@1,S(0)@0");
  EXPECT_EQ(c.out, "S(0)@1,S(0)@0");
}

TEST(UnaryRules, MonotoneKeepsMaxAndMin) {
  // exp of P(sum) needs Replicate; of P(max) stays P(max).
  Forward f = forward("elementwise_unary_monotone", k22, spec({12, 6}, "P(sum),S(0)"));
  EXPECT_EQ(f.in, "R,S(0)");
  EXPECT_EQ(f.out, "R,S(0)");
  Forward g = forward("elementwise_unary_monotone", k22, spec({12, 6}, "P(max),P(min)"));
  EXPECT_EQ(g.in, "P(max),P(min)");
  EXPECT_EQ(g.out, "P(max),P(min)");
  EXPECT_EQ(forward("elementwise_unary_monotone", k2, spec({12}, "P(avg)")).out, "R");
}

TEST(UnaryRules, NegSwapsMaxAndMin) {
  Forward f = forward("neg", k22, spec({12, 6}, "P(max),S(0)"));
  EXPECT_EQ(f.in, "P(max),S(0)");
  EXPECT_EQ(f.out, "P(min),S(0)");
  EXPECT_EQ(forward("neg", k22, spec({12, 6}, "P(sum),P(avg)")).out, "P(sum),P(avg)");
  EXPECT_EQ(forward("neg", k2, spec({12}, "P(min)")).out, "P(max)");
  // Integers wrap around (-(-128) == -128 in i8): only P(sum) passes.
  Forward i = forward("neg", k22, spec({12, 6}, "P(max),P(sum)", DType::I8));
  EXPECT_EQ(i.in, "R,P(sum)");
  EXPECT_EQ(i.out, "R,P(sum)");
  EXPECT_EQ(forward("neg", k2, spec({12}, "P(avg)", DType::I32)).out, "R");
}

TEST(UnaryRules, ScaleExactnessConditions) {
  TensorSpec sum = spec({12}, "P(sum)"), avg = spec({12}, "P(avg)"), mx = spec({12}, "P(max)");
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(2, 0.5)).out, "R");       // affine part
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(2, 0)).out, "P(sum)");    // linear
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(2, 1, false)).out, "R");  // 2 (x + 1)
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(0, 1, false)).out, "P(sum)");  // 0 (x + 1) == 0
  EXPECT_EQ(forward("scale", k2, sum, Attrs{}).out, "P(sum)");              // defaults: identity
  EXPECT_EQ(forward("scale", k2, avg, scale_attrs(-3, 7)).out, "P(avg)");
  EXPECT_EQ(forward("scale", k2, mx, scale_attrs(2, 7)).out, "P(max)");
  EXPECT_EQ(forward("scale", k2, mx, scale_attrs(-2, 7)).out, "P(min)");
  EXPECT_EQ(forward("scale", k2, mx, scale_attrs(0, 7)).out, "P(max)");
  // Integers: P(sum) iff no bias; P(avg) never; P(max) only for a constant output.
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(sum)", DType::I32), scale_attrs(3, 0)).out, "P(sum)");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(sum)", DType::I32), scale_attrs(3, 1)).out, "R");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(avg)", DType::I32), scale_attrs(1, 0)).out, "R");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(max)", DType::I32), scale_attrs(2, 0)).out, "R");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(max)", DType::I32), scale_attrs(0, 4)).out, "P(max)");
}

TEST(UnaryRules, CastExactnessConditions) {
  EXPECT_EQ(forward("cast", k22, spec({12, 6}, "P(sum),P(max)"), cast_to("f32")).out, "P(sum),P(max)");
  EXPECT_EQ(forward("cast", k22, spec({12, 6}, "P(avg),S(1)", DType::F32), cast_to("bf16")).out, "P(avg),S(1)");
  // Widening: f32 parts summed in f64 are not the f32 sum widened; max/min stay exact.
  Forward fw = forward("cast", k22, spec({12, 6}, "P(avg),P(min)", DType::F32), cast_to("f64"));
  EXPECT_EQ(fw.in, "R,P(min)");
  EXPECT_EQ(fw.out, "R,P(min)");
  Forward fi = forward("cast", k22, spec({12, 6}, "P(sum),P(max)"), cast_to("i32"));
  EXPECT_EQ(fi.in, "R,P(max)");
  EXPECT_EQ(fi.out, "R,P(max)");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(max)"), cast_to("bool")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(min)", DType::I8), cast_to("i64")).out, "P(min)");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(min)", DType::I64), cast_to("i8")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(max)", DType::I8), cast_to("u8")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(sum)", DType::I32), cast_to("f64")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(sum)", DType::I32), cast_to("i32")).out, "P(sum)");
  EXPECT_THROW(forward("cast", k2, spec({12}, "R"), Attrs{}), Error);
  EXPECT_THROW(forward("cast", k2, spec({12}, "R"), cast_to("f128")), Error);
}

TEST(UnaryRules, ReverseMapsWantedPartialsBack) {
  TensorSpec x = spec({12, 6}, "R,R");
  Forward n = reverse("neg", k22, x, spec({12, 6}, "P(max),S(1)"));
  EXPECT_EQ(n.in, "P(min),S(1)");
  EXPECT_EQ(n.out, "P(max),S(1)");
  Forward e = reverse("elementwise_unary", k22, x, spec({12, 6}, "P(sum),S(0)"));
  EXPECT_EQ(e.in, "R,S(0)");
  EXPECT_EQ(e.out, "R,S(0)");
  Forward m = reverse("elementwise_unary_monotone", k22, x, spec({12, 6}, "P(min),P(avg)"));
  EXPECT_EQ(m.in, "P(min),R");
  EXPECT_EQ(m.out, "P(min),R");
  EXPECT_EQ(reverse("scale", k2, spec({12}, "R"), spec({12}, "P(sum)"), scale_attrs(2, 1)).out, "R");
  Forward s = reverse("scale", k2, spec({12}, "R"), spec({12}, "P(min)"), scale_attrs(-2, 1));
  EXPECT_EQ(s.in, "P(max)");
  EXPECT_EQ(s.out, "P(min)");
  Forward c = reverse("cast", k2, spec({12}, "R"), spec({12}, "P(max)", DType::I32), cast_to("i32"));
  EXPECT_EQ(c.in, "P(max)");
  EXPECT_EQ(reverse("cast", k2, spec({12}, "R"), spec({12}, "P(sum)", DType::I32), cast_to("i32")).out, "R");
  Forward co = reverse("elementwise_unary", k23, x, spec({12, 6}, "S(0)@1,S(0)@0"));
  EXPECT_EQ(co.in, "S(0)@1,S(0)@0");
}

TEST(UnaryRules, NonLinearGradMergesShardingsAndPassesLinearPartials) {
  // dy's shard on mesh dim 1 spreads to x and out; dy's P(sum) on mesh dim 0 passes (x, out R).
  EXPECT_EQ(grad("elementwise_unary", k22, spec({12, 6}, "R,R"), spec({12, 6}, "R,R"), spec({12, 6}, "P(sum),S(1)")),
            "R,S(1) | R,S(1) | P(sum),S(1) -> P(sum),S(1)");
  // x shards first: dy's Partial on that mesh dim is resharded to the shard.
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12, 6}, "S(0)"), spec({12, 6}, "R"), spec({12, 6}, "P(avg)")),
            "S(0) | S(0) | S(0) -> S(0)");
  // A Partial x is made Replicate; dy keeps its P(sum).
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12}, "P(sum)"), spec({12}, "R"), spec({12}, "P(sum)")),
            "R | R | P(sum) -> P(sum)");
  // P(max) dy is not linear-exact for a non-linear op.
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(max)")), "R | R | R -> R");
  // ... but it is for a non-decreasing op (f' >= 0).
  EXPECT_EQ(grad("elementwise_unary_monotone", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(max)")),
            "R | R | P(max) -> P(max)");
  // First tensor wins a conflict: x's S(0) over dy's S(1) on the same mesh dim.
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12, 6}, "S(0)"), spec({12, 6}, "R"), spec({12, 6}, "S(1)")),
            "S(0) | S(0) | S(0) -> S(0)");
}

TEST(UnaryRules, LinearGradsIgnoreXAndMapDy) {
  EXPECT_EQ(grad("neg", k22, spec({12, 6}, "P(sum),R"), spec({12, 6}, "S(0),R"), spec({12, 6}, "P(max),S(1)")),
            "P(sum),R | S(0),R | P(max),S(1) -> P(min),S(1)");
  // scale's gradient s dy has no bias: P(sum) passes even with a bias.
  EXPECT_EQ(grad("scale", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(sum)"), scale_attrs(2, 5)),
            "R | R | P(sum) -> P(sum)");
  EXPECT_EQ(grad("scale", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(max)"), scale_attrs(-2, 5)),
            "R | R | P(max) -> P(min)");
  // cast f32 -> f64: dx = dy (f64) cast back to f32, a narrowing float cast: P(sum) passes.
  EXPECT_EQ(grad("cast", k2, spec({12}, "R", DType::F32), spec({12}, "R"), spec({12}, "P(sum)"), cast_to("f64")),
            "R | R | P(sum) -> P(sum)");
  // cast f64 -> f32: dx = dy (f32) widened to f64: P(sum) is resharded, P(min) passes.
  EXPECT_EQ(grad("cast", k22, spec({12, 6}, "R,R"), spec({12, 6}, "R,R", DType::F32),
                 spec({12, 6}, "P(sum),P(min)", DType::F32), cast_to("f32")),
            "R,R | R,R | R,P(min) -> R,P(min)");
  // cast f64 -> i32: dx = cast(dy i32 -> f64): P(sum) is resharded, P(max) passes.
  EXPECT_EQ(grad("cast", k22, spec({12, 6}, "R,R"), spec({12, 6}, "R,R", DType::I32),
                 spec({12, 6}, "P(sum),P(max)", DType::I32), cast_to("i32")),
            "R,R | R,R | R,P(max) -> R,P(max)");
}

TEST(UnaryRules, ErrorsNameTheRule) {
  std::vector<TensorSpec> two = {spec({12}, "R"), spec({12}, "R")};
  try {
    op_registry().rule("elementwise_unary").forward(k2, two, Attrs{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("elementwise_unary"), std::string::npos) << e.what();
  }
  std::vector<TensorSpec> g = {spec({12}, "R"), spec({12}, "R"), spec({6}, "R")};
  EXPECT_THROW(op_registry().rule("elementwise_unary").grad(k2, g, Attrs{}), Error);
  std::vector<TensorSpec> bad = {spec({12}, "S(1)")};
  EXPECT_THROW(op_registry().rule("neg").forward(k2, bad, Attrs{}), Error);
}

}  // namespace
}  // namespace rule_tests

// ---- registry entries (from ops/test_unary_ops.cc)
namespace op_tests {
namespace {

const std::vector<std::string> kUnaryOps = {"abs",  "neg",  "exp",     "log",  "sqrt", "rsqrt",
                                            "reciprocal", "sin", "cos", "tanh", "sigmoid", "relu",
                                            "gelu", "silu", "square", "sign", "scale", "cast"};

TEST(UnaryOps, RegisteredWithExistingRules) {
  for (const std::string& name : kUnaryOps) {
    const OpDef* op = op_registry().find(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_EQ(op->family, "unary") << name;
    EXPECT_EQ(op->num_inputs, 1);
    EXPECT_EQ(op->num_outputs, 1);
    EXPECT_TRUE(op->backward) << name;
    EXPECT_TRUE(op->rule.forward && op->rule.reverse && op->rule.grad) << name << " holds rule " << op->rule.name;
  }
  EXPECT_EQ(op_registry().get("neg").rule.name, "neg");
  EXPECT_EQ(op_registry().get("exp").rule.name, "elementwise_unary_monotone");
  EXPECT_EQ(op_registry().get("gelu").rule.name, "elementwise_unary");
}

TEST(UnaryOps, CasesCoverEvenUnevenAndEmptyShardsAndDtypes) {
  const std::set<std::string> with_ints = {"abs", "neg", "sign", "square", "scale", "cast"};
  for (const std::string& name : kUnaryOps) {
    const OpDef& op = op_registry().get(name);
    bool even = false, uneven = false, tiny = false, f32 = false, f64 = false, ints = false;
    for (const VerifyCase& c : op.cases) {
      ASSERT_EQ(c.shapes.size(), 1u) << name;
      ASSERT_EQ(c.dtypes.size(), 1u) << name;
      const Shape& s = c.shapes[0];
      EXPECT_LE(s.numel(), 100) << name;
      EXPECT_LE(s.ndim(), 3) << name;
      for (int64_t d : s) {
        even |= d % 12 == 0;
        uneven |= d == 5 || d == 7;
        tiny |= d <= 2;
      }
      f32 |= c.dtypes[0] == DType::F32;
      f64 |= c.dtypes[0] == DType::F64;
      ints |= is_integral(c.dtypes[0]);
      // Every case must be accepted by the op's own shape inference.
      std::vector<TensorMeta> in = {{s, c.dtypes[0]}};
      EXPECT_NO_THROW(infer_checked(op, in, c.attrs)) << name << " " << s.to_string();
    }
    EXPECT_TRUE(even && uneven && tiny) << name;
    EXPECT_TRUE(f32 && f64) << name;
    EXPECT_EQ(ints, with_ints.count(name) == 1) << name;
  }
}

TEST(UnaryOps, InferChecksDtypesAndAttrs) {
  std::vector<TensorMeta> i32 = {{Shape{3}, DType::I32}};
  EXPECT_THROW(infer_checked(op_registry().get("exp"), i32, {}), Error);
  EXPECT_EQ(infer_checked(op_registry().get("abs"), i32, {})[0].dtype, DType::I32);
  EXPECT_THROW(infer_checked(op_registry().get("scale"), i32, Attrs{{"scale", 0.5}}), Error);
  const OpDef& cast = op_registry().get("cast");
  std::vector<TensorMeta> out = infer_checked(cast, i32, Attrs{{"dtype", std::string("bf16")}});
  EXPECT_EQ(out[0].dtype, DType::BF16);
  EXPECT_EQ(out[0].shape, Shape{3});
  EXPECT_THROW(infer_checked(cast, i32, {}), Error);
  std::vector<TensorMeta> two = {{Shape{3}, DType::F32}, {Shape{3}, DType::F32}};
  EXPECT_THROW(infer_checked(op_registry().get("relu"), two, {}), Error);
}

TEST(UnaryOps, KernelsThroughTheRegistry) {
  Tensor x = Tensor::from<double>(Shape{3}, std::vector<double>{-1.0, 0.5, 2.0});
  std::vector<Tensor> in = {x};
  const OpDef& scale = op_registry().get("scale");
  Attrs attrs{{"scale", 2.0}, {"bias", 1.0}, {"bias_after_scale", false}};
  std::vector<Tensor> out = scale.forward(in, attrs);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].at(0), 0.0);  // 2 * (-1 + 1)
  EXPECT_EQ(out[0].at(2), 6.0);
  std::vector<Tensor> dy = {Tensor::full(DType::F64, Shape{3}, 1.5)};
  std::vector<Tensor> dx = scale.backward(in, out, dy, attrs);
  ASSERT_EQ(dx.size(), 1u);
  EXPECT_EQ(dx[0].at(1), 3.0);

  const OpDef& relu = op_registry().get("relu");
  std::vector<Tensor> r = relu.forward(in, {});
  EXPECT_EQ(r[0].at(0), 0.0);
  EXPECT_EQ(relu.backward(in, r, dy, {})[0].at(2), 1.5);

  const OpDef& cast = op_registry().get("cast");
  Attrs to_i8{{"dtype", std::string("i8")}};
  std::vector<Tensor> c = cast.forward(in, to_i8);
  EXPECT_EQ(c[0].dtype(), DType::I8);
  std::vector<Tensor> cdy = {Tensor::full(DType::I8, Shape{3}, 2)};
  Tensor cdx = cast.backward(in, c, cdy, to_i8)[0];
  EXPECT_EQ(cdx.dtype(), DType::F64);
  EXPECT_EQ(cdx.at(0), 2.0);
  std::vector<Tensor> ints = {Tensor::full(DType::I32, Shape{2}, 3)};
  EXPECT_FALSE(cast.backward(ints, cast.forward(ints, to_i8), cdy, to_i8)[0].defined());
}

}  // namespace
}  // namespace op_tests

}  // namespace shardwise::ops
