// The activation family: swiglu's kernels against silu and multiply of the unary and binary
// families and against central differences, its rule's answers derived by hand, its registry entry.
// (The verifier proves the rule on every mesh and placement: tests/verify/test_every_rule.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/activation/kernels.h"
#include "shardwise/ops/binary/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/unary/kernels.h"
#include "tests/ops/numeric_grad.h"

namespace shardwise::ops {
namespace {

using mesh::parse_dist;
using spmd::SpmdResult;
using spmd::TensorSpec;

Tensor random_f64(const Shape& shape, uint64_t seed) {
  Tensor t(DType::F64, shape);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.set_at(i, static_cast<double>(s >> 11) / 9007199254740992.0 * 8.0 - 4.0);  // [-4, 4)
  }
  return t;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    EXPECT_NEAR(got.at(i), want.at(i), tol * std::max(1.0, std::abs(want.at(i)))) << what << " at " << i;
  }
}

TEST(SwigluKernel, EqualsSiluTimesUp) {
  Tensor g = random_f64({6, 7}, 1), u = random_f64({6, 7}, 2);
  Tensor want = binary(BinaryOp::Multiply, unary(UnaryOp::Silu, g), u);
  expect_close(swiglu(g, u), want, 1e-15, "f64");
  // Hand values: silu(0) = 0, silu(1) = 1 / (1 + e^-1).
  Tensor g2 = Tensor::from<double>({3}, std::vector<double>{0.0, 1.0, -30.0});
  Tensor u2 = Tensor::from<double>({3}, std::vector<double>{5.0, 2.0, 1.0});
  Tensor o = swiglu(g2, u2);
  EXPECT_EQ(o.at(0), 0.0);
  EXPECT_NEAR(o.at(1), 2.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(o.at(2), -30.0 / (1.0 + std::exp(30.0)), 1e-25);  // no overflow for large |g|
}

TEST(SwigluKernel, BackwardMatchesFiniteDifferences) {
  Tensor g = random_f64({4, 5}, 3), u = random_f64({4, 5}, 4), w = random_f64({4, 5}, 5);
  SwigluGrads grads = swiglu_backward(g, u, w);
  std::vector<double> dg = testing_util::numeric_grad(g, w, [&] { return swiglu(g, u); });
  std::vector<double> du = testing_util::numeric_grad(u, w, [&] { return swiglu(g, u); });
  for (int64_t i = 0; i < g.numel(); ++i) {
    EXPECT_NEAR(grads.dgate.at(i), dg[static_cast<size_t>(i)], 1e-6) << "dgate " << i;
    EXPECT_NEAR(grads.dup.at(i), du[static_cast<size_t>(i)], 1e-6) << "dup " << i;
  }
}

TEST(SwigluKernel, SixteenAndThirtyTwoBitFloatsFollowF64) {
  Tensor g = random_f64({3, 8}, 6), u = random_f64({3, 8}, 7), d = random_f64({3, 8}, 8);
  SwigluGrads want = swiglu_backward(g, u, d);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double tol = dt == DType::F32 ? 1e-6 : dt == DType::F16 ? 4e-3 : 3e-2;
    Tensor gl = g.to(dt), ul = u.to(dt), dl = d.to(dt);
    expect_close(swiglu(gl, ul).to(DType::F64), swiglu(gl.to(DType::F64), ul.to(DType::F64)), tol, "out");
    SwigluGrads got = swiglu_backward(gl, ul, dl);
    SwigluGrads ref = swiglu_backward(gl.to(DType::F64), ul.to(DType::F64), dl.to(DType::F64));
    expect_close(got.dgate.to(DType::F64), ref.dgate, tol, "dgate");
    expect_close(got.dup.to(DType::F64), ref.dup, tol, "dup");
  }
  (void)want;
}

TEST(SwigluKernel, BadInputsAreErrorsNamingTheShapes) {
  Tensor a = random_f64({2, 3}, 1), b = random_f64({3, 2}, 2);
  try {
    swiglu(a, b);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("2x3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3x2"), std::string::npos) << msg;
  }
  EXPECT_THROW(swiglu(a.to(DType::I64), a.to(DType::I64)), Error);
  EXPECT_THROW(swiglu(a, a.to(DType::F32)), Error);
}

// ---- rule (answers derived by hand from the file comment of ops/activation/rules.cc)

const spmd::Rule& rule() { return op_registry().get("swiglu").rule; }
const mesh::ProcessMesh k22(Shape{2, 2});

TensorSpec spec(const char* dist) { return {Shape{12, 6}, DType::F64, parse_dist(dist, 2)}; }

std::string show(const SpmdResult& r) {
  std::string s;
  for (const auto& d : r.inputs) s += d.to_string() + " | ";
  s += "->";
  for (const auto& d : r.outputs) s += " " + d.to_string();
  return s;
}

TEST(SwigluRule, ShardsPassAndGateWins) {
  EXPECT_EQ(show(rule().forward(k22, std::vector<TensorSpec>{spec("S(0),S(1)"), spec("R,R")}, {})),
            "S(0),S(1) | S(0),S(1) | -> S(0),S(1)");
  // up shards dim 0 on mesh dim 0 too, but gate's S(1) there wins.
  EXPECT_EQ(show(rule().forward(k22, std::vector<TensorSpec>{spec("S(1),R"), spec("S(0),R")}, {})),
            "S(1),R | S(1),R | -> S(1),R");
}

TEST(SwigluRule, OnlyUpsLinearPartialPasses) {
  EXPECT_EQ(show(rule().forward(k22, std::vector<TensorSpec>{spec("S(0),R"), spec("S(0),P(sum)")}, {})),
            "S(0),R | S(0),P(sum) | -> S(0),P(sum)");
  EXPECT_EQ(show(rule().forward(k22, std::vector<TensorSpec>{spec("P(sum),R"), spec("R,R")}, {})),
            "R,R | R,R | -> R,R");
  EXPECT_EQ(show(rule().forward(k22, std::vector<TensorSpec>{spec("R,R"), spec("P(max),P(avg)")}, {})),
            "R,R | R,P(avg) | -> R,P(avg)");
  EXPECT_EQ(show(rule().reverse(k22, std::vector<TensorSpec>{spec("R,R"), spec("R,R")},
                                std::vector<TensorSpec>{spec("S(0),P(sum)")}, {})),
            "S(0),R | S(0),P(sum) | -> S(0),P(sum)");
  EXPECT_EQ(show(rule().reverse(k22, std::vector<TensorSpec>{spec("R,R"), spec("R,R")},
                                std::vector<TensorSpec>{spec("P(max),R")}, {})),
            "R,R | R,R | -> R,R");
}

TEST(SwigluRule, GradKeepsTheOutputAndPassesDoutOrUp) {
  // gate, up, out, dout: out is not read and keeps its layout.
  std::vector<TensorSpec> g = {spec("S(0),R"), spec("R,R"), spec("P(sum),R"), spec("R,P(sum)")};
  EXPECT_EQ(show(rule().grad(k22, g, {})), "S(0),R | S(0),R | P(sum),R | S(0),P(sum) | -> S(0),P(sum) S(0),P(sum)");
  g = {spec("R,R"), spec("R,P(avg)"), spec("R,R"), spec("R,R")};
  EXPECT_EQ(show(rule().grad(k22, g, {})), "R,R | R,P(avg) | R,R | R,R | -> R,P(avg) R,R");
}

// ---- registry entry

TEST(ActivationOps, SwigluEntry) {
  const OpDef& op = op_registry().get("swiglu");
  EXPECT_EQ(op.family, "activation");
  EXPECT_EQ(op.rule.name, "swiglu");
  EXPECT_EQ(op.num_inputs, 2);
  EXPECT_FALSE(op.backward_reads_value(2, {}));  // the output is not read by the gradient
  std::vector<TensorMeta> in = {{Shape{4, 6}, DType::F32}, {Shape{4, 6}, DType::F32}};
  EXPECT_EQ(infer_checked(op, in, {})[0].shape, (Shape{4, 6}));
  in[1].shape = Shape{6, 4};
  EXPECT_THROW(infer_checked(op, in, {}), Error);
  Tensor g = random_f64({2, 3}, 9), u = random_f64({2, 3}, 10);
  std::vector<Tensor> args = {g, u};
  expect_close(run_forward(op, args, {})[0], swiglu(g, u), 0, "through the registry");
}

}  // namespace
}  // namespace shardwise::ops
