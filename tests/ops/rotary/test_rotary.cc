// The rotary family: rotary_embedding's kernels against a complex-number rotation written here
// and against central differences, hand values, its rule's answers derived by hand, its registry
// entry. (The verifier proves the rule on every mesh and placement: tests/verify/test_every_rule.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/rotary/kernels.h"
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

Tensor positions_of(std::vector<int64_t> p) {
  const auto n = static_cast<int64_t>(p.size());
  return Tensor::from<int64_t>({n}, std::move(p));
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    EXPECT_NEAR(got.at(i), want.at(i), tol * std::max(1.0, std::abs(want.at(i)))) << what << " at " << i;
  }
}

// The pair (x[i], x[i + D/2]) as the complex number x[i] + j x[i + D/2], multiplied by e^{j a},
// a = p / theta^(2i / D): the rotation RoPE applies, written independently of the kernel. With
// B * S positions (per-sequence), row r of x[b, ...] reads positions[b * S + s].
Tensor complex_reference(const Tensor& x, const std::vector<int64_t>& positions, double theta) {
  const int64_t D = x.shape()[x.ndim() - 1], S = x.shape()[x.ndim() - 2], h = D / 2;
  const int64_t per_row = x.numel() / D / x.shape()[0];  // rows of one x[b]
  const bool per_batch = static_cast<int64_t>(positions.size()) != S;
  Tensor out(DType::F64, x.shape());
  for (int64_t r = 0; r < x.numel() / D; ++r) {
    const int64_t at = (per_batch ? (r / per_row) * S : 0) + r % S;
    const double p = static_cast<double>(positions[static_cast<size_t>(at)]);
    for (int64_t i = 0; i < h; ++i) {
      std::complex<double> z(x.at(r * D + i), x.at(r * D + i + h));
      z *= std::polar(1.0, p * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D)));
      out.set_at(r * D + i, z.real());
      out.set_at(r * D + i + h, z.imag());
    }
  }
  return out;
}

TEST(RotaryKernel, EqualsAComplexRotationOfTheHalves) {
  std::vector<int64_t> pos = {0, 1, 2, 7, 15};
  Tensor x = random_f64({2, 3, 5, 8}, 1);
  expect_close(rotary_embedding(x, positions_of(pos), 10000.0), complex_reference(x, pos, 10000.0), 1e-14, "theta 1e4");
  expect_close(rotary_embedding(x, positions_of(pos), 500000.0), complex_reference(x, pos, 500000.0), 1e-14, "5e5");
  // Hand values: D = 2 rotates (1, 0) by p radians; position 0 is the identity.
  Tensor one = Tensor::from<double>({2, 2}, std::vector<double>{1.0, 0.0, 1.0, 0.0});
  Tensor o = rotary_embedding(one, positions_of({0, 1}), 10000.0);
  EXPECT_EQ(o.at(0), 1.0);
  EXPECT_EQ(o.at(1), 0.0);
  EXPECT_NEAR(o.at(2), std::cos(1.0), 1e-16);
  EXPECT_NEAR(o.at(3), std::sin(1.0), 1e-16);
}

// Positions [B, S] (packed documents restart them per sequence): x[b] rotates by row b.
TEST(RotaryKernel, PerSequencePositionsRotateEachBatchRowByItsOwn) {
  const std::vector<int64_t> pos = {0, 1, 2, 0, 1, /**/ 4, 0, 9, 1, 2, /**/ 3, 3, 0, 0, 7};
  Tensor p = Tensor::from<int64_t>({3, 5}, pos);
  Tensor x = random_f64({3, 2, 5, 8}, 5);
  expect_close(rotary_embedding(x, p, 10000.0), complex_reference(x, pos, 10000.0), 1e-14, "[B, heads, S, D]");
  Tensor x3 = random_f64({3, 5, 6}, 6);
  expect_close(rotary_embedding(x3, p, 500.0), complex_reference(x3, pos, 500.0), 1e-14, "[B, S, D]");
  expect_close(rotary_embedding_backward(rotary_embedding(x, p, 1e4), p, 1e4), x, 1e-14, "round trip");
  // A [B, S] row equal for every b is the shared [S] row.
  Tensor same = Tensor::from<int64_t>({3, 5}, std::vector<int64_t>{0, 5, 2, 8, 1, 0, 5, 2, 8, 1, 0, 5, 2, 8, 1});
  expect_close(rotary_embedding(x, same, 1e4), rotary_embedding(x, positions_of({0, 5, 2, 8, 1}), 1e4), 0, "shared");
}

TEST(RotaryKernel, BackwardIsTheInverseRotationAndMatchesFiniteDifferences) {
  std::vector<int64_t> pos = {3, 0, 9};
  Tensor x = random_f64({2, 3, 6}, 2), w = random_f64({2, 3, 6}, 3);
  Tensor dx = rotary_embedding_backward(w, positions_of(pos), 10000.0);
  std::vector<double> num = testing_util::numeric_grad(x, w, [&] { return rotary_embedding(x, positions_of(pos), 1e4); });
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(dx.at(i), num[static_cast<size_t>(i)], 1e-6) << i;
  // Rotating back undoes the rotation.
  expect_close(rotary_embedding_backward(rotary_embedding(x, positions_of(pos), 1e4), positions_of(pos), 1e4), x,
               1e-14, "round trip");
}

TEST(RotaryKernel, FloatTypesFollowF64AndI32PositionsEqualI64) {
  std::vector<int64_t> pos = {0, 5, 11, 2};
  Tensor x = random_f64({3, 4, 8}, 4);
  Tensor want = rotary_embedding(x, positions_of(pos), 1e4);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double tol = dt == DType::F32 ? 1e-6 : dt == DType::F16 ? 4e-3 : 3e-2;
    expect_close(rotary_embedding(x.to(dt), positions_of(pos), 1e4).to(DType::F64), want, 4 * tol, std::string(dtype_name(dt)));
  }
  Tensor p32 = positions_of(pos).to(DType::I32);
  expect_close(rotary_embedding(x, p32, 1e4), want, 0, "i32 positions");
}

TEST(RotaryKernel, BadInputsAreErrorsNamingTheProblem) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor odd = random_f64({4, 5}, 1);
  EXPECT_NE(message([&] { rotary_embedding(odd, positions_of({0, 1, 2, 3}), 1e4); }).find("must be even"),
            std::string::npos);
  Tensor x = random_f64({4, 6}, 2);
  EXPECT_NE(message([&] { rotary_embedding(x, positions_of({0, 1, 2}), 1e4); }).find("positions must be [4]"),
            std::string::npos);
  EXPECT_NE(message([&] { rotary_embedding(x, x, 1e4); }).find("positions must be [4]"), std::string::npos);
  // Per-sequence positions need x's dim 0 beside the sequence: [B, S] of a 3-d x, not of [S, D].
  Tensor x3 = random_f64({2, 4, 6}, 3);
  EXPECT_NE(message([&] { rotary_embedding(x3, Tensor::from<int64_t>({3, 4}, std::vector<int64_t>(12, 0)), 1e4); })
                .find("positions must be [4] (one per row of x's dim -2, x 2x4x6) or [2, 4] (per x's dim 0 too), got 3x4"),
            std::string::npos);
  EXPECT_NE(message([&] { rotary_embedding(x, Tensor::from<int64_t>({4, 4}, std::vector<int64_t>(16, 0)), 1e4); })
                .find("positions must be [4]"),
            std::string::npos);
  EXPECT_NE(message([&] { rotary_embedding(x, positions_of({0, 1, 2, 3}), 0.0); }).find("theta"), std::string::npos);
  EXPECT_THROW(rotary_embedding(x.to(DType::I64), positions_of({0, 1, 2, 3}), 1e4), Error);
}

// ---- rule (answers derived by hand from the file comment of ops/rotary/rules.cc)

const spmd::Rule& rule() { return op_registry().get("rotary_embedding").rule; }
const mesh::ProcessMesh k22(Shape{2, 2});

// x [B, heads, S, D] = [2, 4, 8, 4]; positions [8].
TensorSpec xs(const char* dist) { return {Shape{2, 4, 8, 4}, DType::F64, parse_dist(dist, 2)}; }
TensorSpec ps(const char* dist) { return {Shape{8}, DType::I64, parse_dist(dist, 2)}; }

std::string show(const SpmdResult& r) {
  std::string s;
  for (const auto& d : r.inputs) s += d.to_string() + " | ";
  s += "->";
  for (const auto& d : r.outputs) s += " " + d.to_string();
  return s;
}

std::string fwd(const char* x, const char* p) {
  return show(rule().forward(k22, std::vector<TensorSpec>{xs(x), ps(p)}, {}));
}

TEST(RotaryRule, BatchAndHeadsPassTheHeadDimIsReplicated) {
  EXPECT_EQ(fwd("S(0),S(1)", "R,R"), "S(0),S(1) | R,R | -> S(0),S(1)");
  EXPECT_EQ(fwd("S(3),S(1)", "R,R"), "R,S(1) | R,R | -> R,S(1)");
}

TEST(RotaryRule, ASequenceShardTakesItsOwnPositions) {
  // x shards the sequence: positions follow it (x wins a conflict, as the first input).
  EXPECT_EQ(fwd("S(2),R", "R,R"), "S(2),R | S(0),R | -> S(2),R");
  EXPECT_EQ(fwd("S(2),R", "R,S(0)"), "S(2),R | S(0),R | -> S(2),R");
  // Only positions shard it: x follows.
  EXPECT_EQ(fwd("R,R", "R,S(0)"), "R,S(2) | R,S(0) | -> R,S(2)");
}

// Per-sequence positions [B, S] = [2, 8] carry x's batch and sequence letters: they follow x's
// shards of both (x wins), and shard x when only they shard a dim.
TensorSpec pbs(const char* dist) { return {Shape{2, 8}, DType::I64, parse_dist(dist, 2)}; }
std::string fwd_per_sequence(const char* x, const char* p) {
  return show(rule().forward(k22, std::vector<TensorSpec>{xs(x), pbs(p)}, {}));
}

TEST(RotaryRule, PerSequencePositionsFollowXsBatchAndSequence) {
  EXPECT_EQ(fwd_per_sequence("S(0),S(1)", "R,R"), "S(0),S(1) | S(0),R | -> S(0),S(1)");
  EXPECT_EQ(fwd_per_sequence("S(0),S(2)", "R,R"), "S(0),S(2) | S(0),S(1) | -> S(0),S(2)");
  EXPECT_EQ(fwd_per_sequence("S(0),S(1)", "S(1),R"), "S(0),S(1) | S(0),R | -> S(0),S(1)");
  EXPECT_EQ(fwd_per_sequence("R,S(1)", "S(0),R"), "S(0),S(1) | S(0),R | -> S(0),S(1)");
}

TEST(RotaryRule, OnlyXsLinearPartialsPass) {
  EXPECT_EQ(fwd("P(sum),S(1)", "R,R"), "P(sum),S(1) | R,R | -> P(sum),S(1)");
  EXPECT_EQ(fwd("P(max),P(avg)", "R,R"), "R,P(avg) | R,R | -> R,P(avg)");
  EXPECT_EQ(fwd("R,R", "P(sum),R"), "R,R | R,R | -> R,R");
  EXPECT_EQ(show(rule().reverse(k22, std::vector<TensorSpec>{xs("R,R"), ps("R,R")},
                                std::vector<TensorSpec>{xs("S(2),P(sum)")}, {})),
            "S(2),P(sum) | S(0),R | -> S(2),P(sum)");
}

TEST(RotaryRule, GradReadsPositionsAndDoutOnly) {
  // x, positions, out, dout: x and out are not read and keep their layouts.
  std::vector<TensorSpec> g = {xs("S(3),R"), ps("R,R"), xs("P(sum),R"), xs("S(2),P(sum)")};
  EXPECT_EQ(show(rule().grad(k22, g, {})), "S(3),R | S(0),R | P(sum),R | S(2),P(sum) | -> S(2),P(sum) R,R");
}

// ---- registry entry

TEST(RotaryOps, RotaryEmbeddingEntry) {
  const OpDef& op = op_registry().get("rotary_embedding");
  EXPECT_EQ(op.family, "rotary");
  EXPECT_EQ(op.rule.name, "rotary_embedding");
  EXPECT_EQ(op.num_inputs, 2);
  EXPECT_FALSE(op.backward_reads_value(0, {}));  // x is not read by the gradient
  EXPECT_TRUE(op.backward_reads_value(1, {}));
  std::vector<TensorMeta> in = {{Shape{2, 5, 6}, DType::F32}, {Shape{5}, DType::I64}};
  EXPECT_EQ(infer_checked(op, in, {})[0].shape, (Shape{2, 5, 6}));
  in[1].shape = Shape{6};
  EXPECT_THROW(infer_checked(op, in, {}), Error);
  Tensor x = random_f64({2, 3, 4}, 9);
  std::vector<Tensor> args = {x, positions_of({4, 5, 6})};
  Attrs a;
  a.set("theta", 100.0);
  expect_close(run_forward(op, args, a)[0], rotary_embedding(x, args[1], 100.0), 0, "through the registry");
}

}  // namespace
}  // namespace shardwise::ops
