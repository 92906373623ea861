// The matmul family: its kernels, SPMD rules and registry entries tested side by side.
//
// The matmul op: shape inference, forward against an independent broadcast-by-index reference,
// hand-computed products, and the backward against central finite differences in f64.
//
// Rule "matmul": explicit expected distributions for forward, reverse and grad.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/matmul/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- registry entries (from ops/test_matmul_op.cc)
namespace op_tests {
namespace {

const OpDef& matmul_op() { return op_registry().get("matmul"); }

Tensor random_tensor(const Shape& shape, DType dtype, int seed) {
  Tensor t(dtype, shape);
  uint64_t s = 0xD1B54A32D192ED03ull * static_cast<uint64_t>(seed + 7);
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = static_cast<double>(s >> 11) / static_cast<double>(1ull << 53);
    t.set_at(i, is_floating(dtype) ? u * 4 - 2 : std::floor(u * 7) - 3);
  }
  return t;
}

Attrs trans_attrs(bool tx, bool ty) {
  Attrs a;
  a.set("trans_x", tx);
  a.set("trans_y", ty);
  return a;
}

// Reference in double: every output element is computed on its own from its multi-index, with
// NumPy's rules applied literally (promote 1-D operands, right-align and stretch batch dims).
Tensor reference_matmul(const Tensor& x, const Tensor& y, bool tx, bool ty) {
  bool xv = x.ndim() == 1, yv = y.ndim() == 1;
  if (xv) tx = false;
  if (yv) ty = false;
  Shape xs = xv ? Shape{1, x.shape()[0]} : x.shape();
  Shape ys = yv ? Shape{y.shape()[0], 1} : y.shape();
  int xr = xs.ndim(), yr = ys.ndim();
  int64_t m = tx ? xs[xr - 1] : xs[xr - 2], k = tx ? xs[xr - 2] : xs[xr - 1];
  int64_t n = ty ? ys[yr - 2] : ys[yr - 1];
  int nb = std::max(xr, yr) - 2;
  std::vector<int64_t> batch(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i) {
    int xi = i - (nb - (xr - 2)), yi = i - (nb - (yr - 2));
    int64_t xe = xi >= 0 ? xs[xi] : 1, ye = yi >= 0 ? ys[yi] : 1;
    batch[static_cast<size_t>(i)] = std::max(xe, ye) == 1 ? 1 : (xe == 1 ? ye : xe);
    if (xe == 0 || ye == 0) batch[static_cast<size_t>(i)] = 0;
  }
  Shape out;
  for (int64_t b : batch) out.push_back(b);
  if (!xv) out.push_back(m);
  if (!yv) out.push_back(n);
  Tensor result(DType::F64, out);
  int64_t total = 1;
  for (int64_t b : batch) total *= b;
  for (int64_t flat = 0; flat < total * m * n; ++flat) {
    int64_t rem = flat;
    int64_t j = rem % n;
    rem /= n;
    int64_t i = rem % m;
    rem /= m;
    std::vector<int64_t> idx(static_cast<size_t>(nb));
    for (int d = nb - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % batch[static_cast<size_t>(d)];
      rem /= batch[static_cast<size_t>(d)];
    }
    // Flat offset of batch item `idx` in an operand of shape s (its last two dims excluded).
    auto base = [&](const Shape& s) {
      int r = s.ndim();
      int64_t off = 0;
      for (int d = 0; d < r - 2; ++d) {
        int64_t e = s[d];
        int64_t id = e == 1 ? 0 : idx[static_cast<size_t>(d + nb - (r - 2))];
        off = off * e + id;
      }
      return off * s[r - 2] * s[r - 1];
    };
    int64_t xb = base(xs), yb = base(ys);
    double sum = 0;
    for (int64_t p = 0; p < k; ++p) {
      double xe = x.at(xb + (tx ? p * m + i : i * k + p));
      double ye = y.at(yb + (ty ? j * k + p : p * n + j));
      sum += xe * ye;
    }
    result.set_at(flat, sum);
  }
  return result;
}

struct Case {
  Shape x, y;
  bool tx = false, ty = false;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{12, 6}, {6, 12}},          {{5, 7}, {7, 3}},           {{6, 2}, {2, 5}},
      {{7, 5}, {7, 3}, true},      {{5, 7}, {3, 7}, false, true}, {{7, 5}, {3, 7}, true, true},
      {{2, 5, 3}, {3, 4}},         {{1, 4, 3}, {2, 3, 5}},     {{3, 1, 2, 4}, {5, 4, 6}},
      {{2, 3, 4}, {2, 5, 3}, true, true},
      {{7}, {7, 3}},               {{5, 7}, {7}},              {{7}, {7}},
      {{4}, {2, 4, 3}},            {{2, 4, 3}, {4}, true, true},  // trans ignored on the 1-D y
      {{0, 3}, {3, 4}},            {{2, 0}, {0, 3}},           {{2, 0, 3}, {1, 3, 2}},
      // A batched x with a 2-D (or 1-D) y runs as one GEMM over the folded batch: with trans_y,
      // two batch dims, a vector y, and an empty batch (dy must still be all zeros).
      {{2, 5, 3}, {4, 3}, false, true}, {{3, 2, 5, 4}, {4, 6}}, {{2, 5, 3}, {3}},
      {{0, 5, 3}, {3, 4}},
  };
  return c;
}

TEST(MatmulOp, Registered) {
  const OpDef& op = matmul_op();
  EXPECT_EQ(op.family, "matmul");
  EXPECT_EQ(op.rule.name, "matmul");
  EXPECT_EQ(op.num_inputs, 2);
  EXPECT_TRUE(op.backward);
  EXPECT_GE(op.cases.size(), 8u);
  for (const VerifyCase& c : op.cases) {
    std::vector<TensorMeta> in = {{c.shapes[0], c.dtypes[0]}, {c.shapes[1], c.dtypes[1]}};
    EXPECT_NO_THROW(infer_checked(op, in, c.attrs));
  }
}

TEST(MatmulOp, HandComputed) {
  const OpDef& op = matmul_op();
  Tensor x = Tensor::from<double>({2, 2}, std::vector<double>{1, 2, 3, 4});
  Tensor y = Tensor::from<double>({2, 2}, std::vector<double>{5, 6, 7, 8});
  std::vector<Tensor> in = {x, y};
  Tensor out = op.forward(in, {})[0];
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  std::vector<double> want = {19, 22, 43, 50};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.at(i), want[static_cast<size_t>(i)]);
  // x^T y = [1 3; 2 4][5 6; 7 8] = [26 30; 38 44]
  out = op.forward(in, trans_attrs(true, false))[0];
  want = {26, 30, 38, 44};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.at(i), want[static_cast<size_t>(i)]);
  // x y^T = [1 2; 3 4][5 7; 6 8] = [17 23; 39 53]
  out = op.forward(in, trans_attrs(false, true))[0];
  want = {17, 23, 39, 53};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.at(i), want[static_cast<size_t>(i)]);
  // Row vector times matrix: [1 2 3] [1 0; 0 1; 1 1] = [4 5]
  std::vector<Tensor> vm = {Tensor::from<int64_t>({3}, std::vector<int64_t>{1, 2, 3}),
                            Tensor::from<int64_t>({3, 2}, std::vector<int64_t>{1, 0, 0, 1, 1, 1})};
  out = op.forward(vm, {})[0];
  EXPECT_EQ(out.shape(), (Shape{2}));
  EXPECT_EQ(out.at(0), 4);
  EXPECT_EQ(out.at(1), 5);
  // Dot product of two vectors: a scalar.
  std::vector<Tensor> vv = {Tensor::from<int32_t>({3}, std::vector<int32_t>{1, 2, 3}),
                            Tensor::from<int32_t>({3}, std::vector<int32_t>{4, -5, 6})};
  out = op.forward(vv, {})[0];
  EXPECT_EQ(out.shape(), Shape{});
  EXPECT_EQ(out.at(0), 12);
}

TEST(MatmulOp, ForwardMatchesReference) {
  const OpDef& op = matmul_op();
  int seed = 0;
  for (const Case& c : cases()) {
    for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::I64, DType::I32}) {
      Tensor x = random_tensor(c.x, dt, seed++), y = random_tensor(c.y, dt, seed++);
      std::vector<Tensor> in = {x, y};
      Tensor out = op.forward(in, trans_attrs(c.tx, c.ty))[0];
      Tensor want = reference_matmul(x, y, c.tx, c.ty);
      ASSERT_EQ(out.dtype(), dt);
      std::vector<TensorMeta> metas = {{c.x, dt}, {c.y, dt}};
      EXPECT_EQ(op.infer(metas, trans_attrs(c.tx, c.ty))[0].shape, want.shape());
      double tol = dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-5 : dt == DType::BF16 ? 3e-2 : 0;
      CompareResult r = compare(out.to(DType::F64), want, tol, tol);
      EXPECT_TRUE(r.equal) << c.x.to_string() << " * " << c.y.to_string() << " tx=" << c.tx << " ty=" << c.ty
                           << " " << dtype_name(dt) << ": " << r.message;
    }
  }
}

// d/dv sum(out * w) by central differences; exact up to rounding since matmul is linear in each input.
Tensor finite_difference(const OpDef& op, std::vector<Tensor> in, size_t which, const Tensor& w, const Attrs& a) {
  Tensor grad(DType::F64, in[which].shape());
  const double h = 1e-3;
  auto loss = [&] {
    Tensor out = op.forward(in, a)[0];
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += out.at(i) * w.at(i);
    return s;
  };
  Tensor v = in[which].clone();
  in[which] = v;
  for (int64_t i = 0; i < v.numel(); ++i) {
    double orig = v.at(i);
    v.set_at(i, orig + h);
    double up = loss();
    v.set_at(i, orig - h);
    double down = loss();
    v.set_at(i, orig);
    grad.set_at(i, (up - down) / (2 * h));
  }
  return grad;
}

TEST(MatmulOp, BackwardMatchesFiniteDifferences) {
  const OpDef& op = matmul_op();
  int seed = 100;
  for (const Case& c : cases()) {
    Attrs a = trans_attrs(c.tx, c.ty);
    std::vector<Tensor> in = {random_tensor(c.x, DType::F64, seed++), random_tensor(c.y, DType::F64, seed++)};
    Tensor out = op.forward(in, a)[0];
    Tensor w = random_tensor(out.shape(), DType::F64, seed++);
    std::vector<Tensor> outs = {out}, grads = {w};
    std::vector<Tensor> g = op.backward(in, outs, grads, a);
    ASSERT_EQ(g.size(), 2u);
    for (size_t t = 0; t < 2; ++t) {
      Tensor fd = finite_difference(op, in, t, w, a);
      CompareResult r = compare(g[t], fd, 1e-7, 1e-7);
      EXPECT_TRUE(r.equal) << "d" << (t ? "y" : "x") << " of " << c.x.to_string() << " * " << c.y.to_string()
                           << " tx=" << c.tx << " ty=" << c.ty << ": " << r.message;
    }
  }
}

TEST(MatmulOp, IntegerBackwardIsExact) {
  const OpDef& op = matmul_op();
  int seed = 300;
  for (const Case& c : cases()) {
    Attrs a = trans_attrs(c.tx, c.ty);
    std::vector<Tensor> in = {random_tensor(c.x, DType::I64, seed++), random_tensor(c.y, DType::I64, seed++)};
    Tensor out = op.forward(in, a)[0];
    Tensor w = random_tensor(out.shape(), DType::I64, seed++);
    std::vector<Tensor> outs = {out}, grads = {w};
    std::vector<Tensor> g = op.backward(in, outs, grads, a);
    std::vector<Tensor> in64 = {in[0].to(DType::F64), in[1].to(DType::F64)};
    for (size_t t = 0; t < 2; ++t) {
      // Integer-valued data: the f64 finite difference is exact up to rounding.
      Tensor fd = finite_difference(op, in64, t, w.to(DType::F64), a);
      CompareResult r = compare(g[t].to(DType::F64), fd, 1e-9, 1e-9);
      EXPECT_TRUE(r.equal) << c.x.to_string() << " * " << c.y.to_string() << ": " << r.message;
    }
  }
}

TEST(MatmulOp, BackwardSumsOverBroadcastBatch) {
  // x [2, 1, 2] * y [2, 1] (y broadcast over the batch): dy = sum_b x[b]^T dout[b].
  const OpDef& op = matmul_op();
  Tensor x = Tensor::from<double>({2, 1, 2}, std::vector<double>{1, 2, 3, 4});
  Tensor y = Tensor::from<double>({2, 1}, std::vector<double>{1, 1});
  Tensor dout = Tensor::from<double>({2, 1, 1}, std::vector<double>{10, 100});
  std::vector<Tensor> in = {x, y}, outs = {Tensor(DType::F64, {2, 1, 1})}, grads = {dout};
  std::vector<Tensor> g = op.backward(in, outs, grads, {});
  EXPECT_EQ(g[1].shape(), (Shape{2, 1}));
  EXPECT_EQ(g[1].at(0), 1 * 10 + 3 * 100);
  EXPECT_EQ(g[1].at(1), 2 * 10 + 4 * 100);
  EXPECT_EQ(g[0].shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(g[0].at(0), 10);
  EXPECT_EQ(g[0].at(3), 100);
}

TEST(MatmulOp, Errors) {
  const OpDef& op = matmul_op();
  auto infer = [&](Shape x, Shape y, DType xt = DType::F32, DType yt = DType::F32, Attrs a = {}) {
    std::vector<TensorMeta> in = {{x, xt}, {y, yt}};
    return infer_checked(op, in, a);
  };
  try {
    infer({4, 5}, {6, 3});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("4x5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6x3"), std::string::npos) << msg;
  }
  try {
    infer({2, 4, 5}, {3, 5, 3});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("2x4x5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3x5x3"), std::string::npos) << msg;
  }
  EXPECT_THROW(infer({4, 5}, {5, 3}, DType::F32, DType::F64), Error);
  EXPECT_THROW(infer({4, 5}, {5, 3}, DType::Bool, DType::Bool), Error);
  EXPECT_THROW(infer({4, 5}, {4, 3}), Error);
  EXPECT_NO_THROW(infer({5, 4}, {4, 3}));
  EXPECT_EQ(infer({5, 4}, {3, 5}, DType::F32, DType::F32, trans_attrs(true, true))[0].shape, (Shape{4, 3}));
  EXPECT_THROW(infer(Shape{}, {3}), Error);
}

}  // namespace
}  // namespace shardwise::ops

namespace shardwise::ops {
namespace {

// The partial gradient kernel (pipelines compute input and weight gradients at different times)
// gives bit for bit the full kernel's gradient it is asked for, and nothing for the other.
TEST(MatmulPartialBackward, EachGradientAloneEqualsTheFullKernels) {
  const OpDef& op = op_registry().get("matmul");
  ASSERT_TRUE(op.backward_partial);
  for (bool trans_y : {false, true}) {
    Attrs attrs;
    if (trans_y) attrs.set("trans_y", true);
    Tensor x = Tensor::full(DType::F32, Shape{2, 5, 7}, 0.5), y = Tensor::full(DType::F32, trans_y ? Shape{3, 7} : Shape{7, 3}, 0.25);
    for (int64_t i = 0; i < x.numel(); ++i) x.set_at(i, 0.01 * static_cast<double>(i % 13) - 0.05);
    for (int64_t i = 0; i < y.numel(); ++i) y.set_at(i, 0.02 * static_cast<double>(i % 7) - 0.06);
    Tensor dout = Tensor::full(DType::F32, Shape{2, 5, 3}, 1.0);
    for (int64_t i = 0; i < dout.numel(); ++i) dout.set_at(i, 0.1 * static_cast<double>(i % 5));
    std::vector<Tensor> in = {x, y}, outs = run_forward(op, in, attrs), douts = {dout};
    std::vector<Tensor> full = run_backward(op, in, outs, douts, attrs);
    bool only_x[] = {true, false}, only_y[] = {false, true};
    std::vector<Tensor> gx = run_backward(op, in, outs, douts, attrs, nullptr, only_x);
    std::vector<Tensor> gy = run_backward(op, in, outs, douts, attrs, nullptr, only_y);
    EXPECT_TRUE(compare(gx[0], full[0]).equal);
    EXPECT_FALSE(gx[1].defined());
    EXPECT_TRUE(compare(gy[1], full[1]).equal);
    EXPECT_FALSE(gy[0].defined());
  }
}

TEST(MatmulDims, ShapesAndErrors) {
  MatmulDims d = matmul_dims({2, 5, 3}, {3, 4}, false, false);
  EXPECT_EQ(d.out, (Shape{2, 5, 4}));
  EXPECT_EQ(d.m, 5);
  EXPECT_EQ(d.k, 3);
  EXPECT_EQ(d.n, 4);
  d = matmul_dims({1, 4, 3}, {2, 3, 5}, false, false);
  EXPECT_EQ(d.out, (Shape{2, 4, 5}));
  d = matmul_dims({7}, {7, 3}, true, false);  // trans ignored on a 1-D operand
  EXPECT_EQ(d.out, (Shape{3}));
  d = matmul_dims({5, 7}, {7}, false, true);
  EXPECT_EQ(d.out, (Shape{5}));
  d = matmul_dims({7}, {7}, false, false);
  EXPECT_EQ(d.out, Shape{});
  d = matmul_dims({7, 5}, {3, 7}, true, true);
  EXPECT_EQ(d.out, (Shape{5, 3}));
  d = matmul_dims({3, 1, 2, 4}, {5, 4, 6}, false, false);
  EXPECT_EQ(d.out, (Shape{3, 5, 2, 6}));
  try {
    matmul_dims({5, 7}, {6, 3}, false, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("5x7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6x3"), std::string::npos) << msg;
  }
  try {
    matmul_dims({2, 5, 7}, {3, 7, 3}, false, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("2x5x7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3x7x3"), std::string::npos) << msg;
  }
  EXPECT_THROW(matmul_dims(Shape{}, {3}, false, false), Error);
}

}  // namespace
}  // namespace op_tests

// ---- SPMD rules (from spmd/test_matmul_rule.cc)
namespace rule_tests {
using namespace spmd;
namespace {

using mesh::parse_dist;

const Rule& rule() { return op_registry().rule("matmul"); }

const ProcessMesh& mesh22() {
  static const ProcessMesh m(Shape{2, 2});
  return m;
}

TensorSpec spec(Shape shape, const char* dist, DType dtype = DType::F64) {
  return {shape, dtype, parse_dist(dist, 2)};
}

Attrs trans(bool tx, bool ty) {
  Attrs a;
  a.set("trans_x", tx);
  a.set("trans_y", ty);
  return a;
}

// Runs the forward rule on x, y and checks required x, y and the output.
void expect_forward(TensorSpec x, TensorSpec y, const char* want_x, const char* want_y, const char* want_out,
                    const Attrs& attrs = {}) {
  std::vector<TensorSpec> in = {x, y};
  SpmdResult r = rule().forward(mesh22(), in, attrs);
  ASSERT_EQ(r.inputs.size(), 2u);
  ASSERT_EQ(r.outputs.size(), 1u);
  std::string given = x.dist.to_string() + " | " + y.dist.to_string();
  EXPECT_EQ(r.inputs[0], parse_dist(want_x, 2)) << given << " -> x " << r.inputs[0].to_string();
  EXPECT_EQ(r.inputs[1], parse_dist(want_y, 2)) << given << " -> y " << r.inputs[1].to_string();
  EXPECT_EQ(r.outputs[0], parse_dist(want_out, 2)) << given << " -> out " << r.outputs[0].to_string();
}

TEST(MatmulRule, Registered) {
  EXPECT_EQ(op_registry().get("matmul").rule.name, "matmul");
  EXPECT_FALSE(rule().summary.empty());
}

TEST(MatmulRule, ForwardShardsBatchMN) {
  // Row-sharded x, column-sharded y: the output keeps both.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,S(1)"), "S(0),R", "R,S(1)", "S(0),S(1)");
  // A replicated operand stays replicated.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,R"), "S(0),R", "R,R", "S(0),R");
  // m co-sharded over both mesh dims.
  expect_forward(spec({12, 6}, "S(0),S(0)"), spec({6, 12}, "R,R"), "S(0),S(0)", "R,R", "S(0),S(0)");
}

TEST(MatmulRule, ForwardContractedShardGivesPartialSum) {
  // x sharded along k on mesh dim 0: y must follow along k, the output is Partial(sum) there.
  expect_forward(spec({12, 6}, "S(1),R"), spec({6, 12}, "R,R"), "S(1),R", "S(0),R", "P(sum),R");
  // k on mesh 0 from y, n on mesh 1 from y.
  expect_forward(spec({12, 6}, "R,R"), spec({6, 12}, "S(0),S(1)"), "S(1),R", "S(0),S(1)", "P(sum),S(1)");
  // trans_x: x stored [k, m]; S(0) is k.
  expect_forward(spec({6, 12}, "S(0),S(1)"), spec({6, 12}, "R,R"), "S(0),S(1)", "S(0),R", "P(sum),S(0)",
                 trans(true, false));
  // trans_y: y stored [n, k]; S(1) is k, S(0) is n.
  expect_forward(spec({12, 6}, "R,R"), spec({12, 6}, "S(1),S(0)"), "S(1),R", "S(1),S(0)", "P(sum),S(1)",
                 trans(false, true));
}

TEST(MatmulRule, ForwardConflictsFirstTensorWins) {
  // Both claim mesh dim 0 (x for m, y for n): x wins, y is replicated there.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "S(1),R"), "S(0),R", "R,R", "S(0),R");
  // k sharded differently: x's mesh dim wins.
  expect_forward(spec({12, 6}, "S(1),R"), spec({6, 12}, "R,S(0)"), "S(1),R", "S(0),R", "P(sum),R");
}

TEST(MatmulRule, ForwardPartialInputs) {
  // x P(sum) with y R: linear in x, the output stays P(sum).
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "R,R"), "P(sum),R", "R,R", "P(sum),R");
  // y P(avg) where x is R: the output is P(avg) there.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,P(avg)"), "S(0),R", "R,P(avg)", "S(0),P(avg)");
  // ... but not where x shards m: sharding beats Partial.
  expect_forward(spec({12, 6}, "R,S(0)"), spec({6, 12}, "R,P(avg)"), "R,S(0)", "R,R", "R,S(0)");
  // x P(sum) and y P(avg) on different mesh dims: both pass through.
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "R,P(avg)"), "P(sum),R", "R,P(avg)", "P(sum),P(avg)");
  // Both Partial on the same mesh dim: x keeps it, y is reduced first.
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "P(sum),R"), "P(sum),R", "R,R", "P(sum),R");
  expect_forward(spec({12, 6}, "P(avg),R"), spec({6, 12}, "P(sum),R"), "P(avg),R", "R,R", "P(avg),R");
  // Max / min are not linear: resharded to Replicate; y's P(sum) then passes.
  expect_forward(spec({12, 6}, "P(max),R"), spec({6, 12}, "P(sum),P(min)"), "R,R", "P(sum),R", "P(sum),R");
  // Sharding beats Partial: y shards n on mesh 0, so x's P(sum) there is reduced first.
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "S(1),R"), "R,R", "S(1),R", "S(1),R");
  // x shards k on mesh 0, y P(sum) there: y is reduced, then follows k.
  expect_forward(spec({12, 6}, "S(1),R"), spec({6, 12}, "P(sum),R"), "S(1),R", "S(0),R", "P(sum),R");
}

TEST(MatmulRule, ForwardBatchBroadcast) {
  // y has no batch dim: x's batch shard passes to the output.
  expect_forward(spec({2, 5, 3}, "S(0),S(1)"), spec({3, 4}, "R,R"), "S(0),S(1)", "R,R", "S(0),S(1)");
  // x's size-1 batch dim broadcasts: it cannot be sharded; y's batch shard wins.
  expect_forward(spec({1, 4, 3}, "S(0),R"), spec({2, 3, 5}, "S(0),S(2)"), "R,R", "S(0),S(2)", "S(0),S(2)");
  // Shared batch letter: y follows x.
  expect_forward(spec({2, 4, 3}, "S(0),R"), spec({2, 3, 5}, "R,R"), "S(0),R", "S(0),R", "S(0),R");
}

TEST(MatmulRule, ForwardVectors) {
  // 1-D x is [k]: sharding it shards k.
  expect_forward(spec({7}, "S(0),R"), spec({7, 3}, "R,S(1)"), "S(0),R", "S(0),S(1)", "P(sum),S(0)");
  // 1-D y is [k]; x's m passes to the 1-D output.
  expect_forward(spec({5, 7}, "S(0),R"), spec({7}, "R,S(0)"), "S(0),S(1)", "R,S(0)", "S(0),P(sum)");
  // Dot product: a Partial(sum) scalar.
  expect_forward(spec({12}, "S(0),R"), spec({12}, "R,R"), "S(0),R", "S(0),R", "P(sum),R");
}

TEST(MatmulRule, ForwardErrors) {
  std::vector<TensorSpec> bad = {spec({5, 7}, "R,R"), spec({6, 3}, "R,R")};
  try {
    rule().forward(mesh22(), bad, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("5x7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6x3"), std::string::npos) << msg;
  }
  std::vector<TensorSpec> one = {spec({5, 7}, "R,R")};
  EXPECT_THROW(rule().forward(mesh22(), one, {}), Error);
  std::vector<TensorSpec> bad_dist = {spec({5, 7}, "R,R"), {Shape{7}, DType::F64, parse_dist("S(1),R", 2)}};
  EXPECT_THROW(rule().forward(mesh22(), bad_dist, {}), Error);
}

void expect_reverse(Shape xs, Shape ys, const char* out, const char* want_x, const char* want_y, const char* want_out,
                    const Attrs& attrs = {}) {
  std::vector<TensorSpec> in = {spec(xs, "R,R"), spec(ys, "R,R")};
  std::vector<TensorSpec> outs = {{Shape{}, DType::F64, parse_dist(out, 2)}};
  // The output shape: from the forward rule's viewpoint the verifier passes it; compute it here.
  std::vector<int64_t> dims;
  bool xv = xs.ndim() == 1, yv = ys.ndim() == 1;
  int nb = std::max(xv ? 0 : xs.ndim() - 2, yv ? 0 : ys.ndim() - 2);
  for (int i = 0; i < nb; ++i) {
    int xi = i - (nb - (xs.ndim() - 2)), yi = i - (nb - (ys.ndim() - 2));
    int64_t a = (!xv && xi >= 0) ? xs[xi] : 1, b = (!yv && yi >= 0) ? ys[yi] : 1;
    dims.push_back(a == 1 ? b : a);
  }
  if (!xv) dims.push_back(attrs.get_bool("trans_x", false) ? xs.back() : xs[xs.ndim() - 2]);
  if (!yv) dims.push_back(attrs.get_bool("trans_y", false) ? ys[ys.ndim() - 2] : ys.back());
  outs[0].shape = Shape(std::span<const int64_t>(dims));
  SpmdResult r = rule().reverse(mesh22(), in, outs, attrs);
  EXPECT_EQ(r.inputs[0], parse_dist(want_x, 2)) << out << " -> x " << r.inputs[0].to_string();
  EXPECT_EQ(r.inputs[1], parse_dist(want_y, 2)) << out << " -> y " << r.inputs[1].to_string();
  EXPECT_EQ(r.outputs[0], parse_dist(want_out, 2)) << out << " -> out " << r.outputs[0].to_string();
}

TEST(MatmulRule, Reverse) {
  expect_reverse({12, 6}, {6, 12}, "S(0),S(1)", "S(0),R", "R,S(1)", "S(0),S(1)");
  // Partial(sum) wanted: k sharded on that mesh dim.
  expect_reverse({12, 6}, {6, 12}, "P(sum),S(0)", "S(1),S(0)", "S(0),R", "P(sum),S(0)");
  expect_reverse({12, 6}, {6, 12}, "P(sum),P(sum)", "S(1),S(1)", "S(0),S(0)", "P(sum),P(sum)");
  // Partial(avg): x carries it, y replicated.
  expect_reverse({12, 6}, {6, 12}, "P(avg),S(1)", "P(avg),R", "R,S(1)", "P(avg),S(1)");
  // Partial(max) cannot be produced: Replicate.
  expect_reverse({12, 6}, {6, 12}, "P(max),S(0)", "R,S(0)", "R,R", "R,S(0)");
  // Transposed storage.
  expect_reverse({6, 12}, {12, 6}, "S(1),P(sum)", "R,S(0)", "S(0),S(1)", "S(1),P(sum)", trans(true, true));
  // Broadcast batch: x [1, 4, 3] cannot follow a batch shard.
  expect_reverse({1, 4, 3}, {2, 3, 5}, "S(0),S(1)", "R,S(1)", "S(0),R", "S(0),S(1)");
  // Vectors: the dot product's Partial(sum) comes from k.
  expect_reverse({12}, {12}, "P(sum),R", "S(0),R", "S(0),R", "P(sum),R");
  expect_reverse({7}, {7, 3}, "S(0),P(sum)", "R,S(0)", "S(1),S(0)", "S(0),P(sum)");
}

struct GradWant {
  const char *x, *y, *out, *dout, *dx, *dy;
};

void expect_grad(TensorSpec x, TensorSpec y, TensorSpec out, TensorSpec dout, GradWant w, const Attrs& attrs = {}) {
  std::vector<TensorSpec> in = {x, y, out, dout};
  SpmdResult r = rule().grad(mesh22(), in, attrs);
  ASSERT_EQ(r.inputs.size(), 4u);
  ASSERT_EQ(r.outputs.size(), 2u);
  std::string given = x.dist.to_string() + " | " + y.dist.to_string() + " | " + dout.dist.to_string();
  const char* names[] = {"x", "y", "out", "dout"};
  const char* want_in[] = {w.x, w.y, w.out, w.dout};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.inputs[i], parse_dist(want_in[i], 2)) << given << " -> " << names[i] << " " << r.inputs[i].to_string();
  }
  EXPECT_EQ(r.outputs[0], parse_dist(w.dx, 2)) << given << " -> dx " << r.outputs[0].to_string();
  EXPECT_EQ(r.outputs[1], parse_dist(w.dy, 2)) << given << " -> dy " << r.outputs[1].to_string();
}

TEST(MatmulRule, GradContractions) {
  // dx = dout y^T contracts n (mesh 1): Partial(sum); dy = x^T dout contracts m (mesh 0).
  expect_grad(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,S(1)"), spec({12, 12}, "S(0),S(1)"),
              spec({12, 12}, "S(0),S(1)"),
              {"S(0),R", "R,S(1)", "S(0),S(1)", "S(0),S(1)", "S(0),P(sum)", "P(sum),S(1)"});
  // k sharded: both grads keep the k shard; dout is replicated on that mesh dim.
  expect_grad(spec({12, 6}, "S(1),R"), spec({6, 12}, "S(0),R"), spec({12, 12}, "P(sum),R"),
              spec({12, 12}, "R,R"), {"S(1),R", "S(0),R", "P(sum),R", "R,R", "S(1),R", "S(0),R"});
  // dout alone decides: its m shard reaches x, its n shard reaches y.
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,R"), spec({12, 12}, "R,R"), spec({12, 12}, "S(0),S(1)"),
              {"S(0),R", "R,S(1)", "R,R", "S(0),S(1)", "S(0),P(sum)", "P(sum),S(1)"});
}

TEST(MatmulRule, GradPartials) {
  // dout P(sum) with x, y R: both grads P(sum). `out` keeps its distribution (not read).
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,R"), spec({12, 12}, "P(max),R"), spec({12, 12}, "P(sum),R"),
              {"R,R", "R,R", "P(max),R", "P(sum),R", "P(sum),R", "P(sum),R"});
  // x P(sum): dy is Partial, dx (from dout and y only) is replicated; dout's P(avg) on the same mesh
  // dim loses to x.
  expect_grad(spec({12, 6}, "P(sum),R"), spec({6, 12}, "R,R"), spec({12, 12}, "P(sum),R"),
              spec({12, 12}, "P(avg),R"), {"P(sum),R", "R,R", "P(sum),R", "R,R", "R,R", "P(sum),R"});
  // y P(avg): dx P(avg), dy replicated.
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,P(avg)"), spec({12, 12}, "R,P(avg)"),
              spec({12, 12}, "R,R"), {"R,R", "R,P(avg)", "R,P(avg)", "R,R", "R,P(avg)", "R,R"});
  // dout P(max): not linear, replicated.
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,R"), spec({12, 12}, "R,R"), spec({12, 12}, "P(max),R"),
              {"R,R", "R,R", "R,R", "R,R", "R,R", "R,R"});
  // Sharding beats Partial: dout's P(sum) on mesh 0 is reduced because x shards m there.
  expect_grad(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,R"), spec({12, 12}, "S(0),R"), spec({12, 12}, "P(sum),R"),
              {"S(0),R", "R,R", "S(0),R", "S(0),R", "S(0),R", "P(sum),R"});
}

TEST(MatmulRule, GradBroadcastBatch) {
  // x [1, 4, 3] broadcasts over the batch that y shards: dx sums the batch -> Partial(sum).
  expect_grad(spec({1, 4, 3}, "R,R"), spec({2, 3, 5}, "S(0),R"), spec({2, 4, 5}, "S(0),R"),
              spec({2, 4, 5}, "S(0),R"), {"R,R", "S(0),R", "S(0),R", "S(0),R", "P(sum),R", "S(0),R"});
  // y [3, 4] has no batch dim: dy is Partial over x's batch shard (and over m).
  expect_grad(spec({2, 5, 3}, "S(0),S(1)"), spec({3, 4}, "R,R"), spec({2, 5, 4}, "S(0),S(1)"),
              spec({2, 5, 4}, "R,R"), {"S(0),S(1)", "R,R", "S(0),S(1)", "S(0),S(1)", "S(0),S(1)", "P(sum),P(sum)"});
}

TEST(MatmulRule, GradVectors) {
  // Dot product: dx = dout * y, dy = dout * x; k sharded on mesh 0, dout P(sum) on mesh 1.
  expect_grad(spec({12}, "S(0),R"), spec({12}, "R,R"), spec(Shape{}, "P(sum),R"), spec(Shape{}, "R,P(sum)"),
              {"S(0),R", "S(0),R", "P(sum),R", "R,P(sum)", "S(0),P(sum)", "S(0),P(sum)"});
  // 1-D y: dx = dout y^T is an outer product (no n to contract).
  expect_grad(spec({5, 7}, "R,S(1)"), spec({7}, "R,R"), spec({5}, "R,P(sum)"), spec({5}, "S(0),R"),
              {"S(0),S(1)", "R,S(0)", "R,P(sum)", "S(0),R", "S(0),S(1)", "P(sum),S(0)"});
}

}  // namespace
}  // namespace rule_tests

}  // namespace shardwise::ops
