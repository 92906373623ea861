// The softmax family: its kernels, SPMD rules and registry entries tested side by side.
//
// softmax / log_softmax / cross_entropy kernels against independent references: hand values,
// a naive reference that walks every element by its multi-index (div / mod) and sums over the
// axis without subtracting the max, and central finite differences in f64 for the backward.
//
// softmax and cross_entropy rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/ops/numeric_grad.h"
#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_softmax.cc)
namespace kernel_tests {
namespace {

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }
Tensor i64(const Shape& s, std::vector<int64_t> v) { return Tensor::from<int64_t>(s, v); }

Tensor random_f64(const Shape& s, unsigned seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (double& x : v) x = d(gen);
  return f64(s, v);
}

void expect_near(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.at(static_cast<int64_t>(i)), want[i], tol) << what << " at " << i;
  }
}

TEST(Softmax, HandValues) {
  Tensor x = f64({3}, {0, std::log(2.0), std::log(3.0)});
  expect_near(softmax(x, -1), {1.0 / 6, 2.0 / 6, 3.0 / 6}, 1e-15, "softmax");
  expect_near(log_softmax(x, 0), {std::log(1.0 / 6), std::log(2.0 / 6), std::log(0.5)}, 1e-15, "log_softmax");
  // Stable for large inputs: the max is subtracted before exp.
  Tensor big = f64({2}, {1000, 1000});
  expect_near(softmax(big, 0), {0.5, 0.5}, 1e-15, "large");
  expect_near(log_softmax(f64({2}, {-1000, 0}), 0), {-1000, 0}, 1e-12, "log_softmax large gap");
  // Axis 0 of a 2-D tensor: columns.
  Tensor m = f64({2, 2}, {0, 5, 0, 5});
  expect_near(softmax(m, 0), {0.5, 0.5, 0.5, 0.5}, 1e-15, "axis 0");
}

// Naive reference: for every element, recover (outer, j, inner) by div / mod and sum exp over
// the axis directly (inputs in [-2, 2], so no max subtraction is needed).
std::vector<double> naive_softmax(const Tensor& x, int axis, bool log) {
  const Shape& s = x.shape();
  int64_t inner = 1;
  for (int d = axis + 1; d < s.ndim(); ++d) inner *= s[d];
  int64_t n = s[axis];
  std::vector<double> out;
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t j = (i / inner) % n;
    int64_t first = i - j * inner;
    double sum = 0;
    for (int64_t t = 0; t < n; ++t) sum += std::exp(x.at(first + t * inner));
    out.push_back(log ? x.at(i) - std::log(sum) : std::exp(x.at(i)) / sum);
  }
  return out;
}

TEST(Softmax, MatchesNaiveReferenceOnEveryAxis) {
  Shape shape{3, 4, 5};
  Tensor x = random_f64(shape, 1);
  for (int axis : {0, 1, 2, -1, -2}) {
    int a = axis < 0 ? axis + 3 : axis;
    expect_near(softmax(x, axis), naive_softmax(x, a, false), 1e-14, "softmax");
    expect_near(log_softmax(x, axis), naive_softmax(x, a, true), 1e-13, "log_softmax");
  }
  EXPECT_EQ(softmax_axis(Attrs{}, 3, "t"), 2);
  EXPECT_EQ(softmax_axis(Attrs{{"axis", int64_t{-3}}}, 3, "t"), 0);
  EXPECT_THROW(softmax_axis(Attrs{{"axis", int64_t{3}}}, 3, "t"), Error);
  EXPECT_THROW(softmax(x, 3), Error);
  EXPECT_THROW(softmax(x.to(DType::I32), 0), Error);
}

TEST(Softmax, EmptyAndLowPrecision) {
  EXPECT_EQ(softmax(Tensor(DType::F64, {0, 3}), 1).shape(), (Shape{0, 3}));
  EXPECT_EQ(log_softmax(Tensor(DType::F64, {2, 0}), 1).shape(), (Shape{2, 0}));
  Tensor x = random_f64({4, 6}, 2);
  EXPECT_TRUE(compare(softmax(x.to(DType::F32), 1).to(DType::F64), softmax(x, 1), 1e-6, 1e-7).equal);
  EXPECT_TRUE(compare(log_softmax(x.to(DType::BF16), 1).to(DType::F64), log_softmax(x, 1), 3e-2, 3e-2).equal);
}

// The f32 rows (last axis, contiguous) run in float with a vectorized exp: within ~1e-6 relative
// of the f64 kernel on wide rows, exactly 0 where a causal mask puts -1e9, NaN for a row with a
// NaN and the f64 semantics (slow path) for rows with infinities; the backward and cross-entropy
// f32 paths likewise.
TEST(Softmax, F32RowsMatchF64) {
  const Shape shape{6, 300};
  Tensor x = random_f64(shape, 7, -12, 12);
  for (int64_t j = 200; j < 300; ++j) x.set_at(j, -1e9);  // row 0: a masked tail
  x.set_at(300 + 5, std::numeric_limits<double>::quiet_NaN());
  x.set_at(600 + 7, -std::numeric_limits<double>::infinity());
  x.set_at(900 + 9, std::numeric_limits<double>::infinity());
  Tensor x32 = x.to(DType::F32), ref = x32.to(DType::F64);
  Tensor y = softmax(x32, 1), want = softmax(ref, 1);
  Tensor ly = log_softmax(x32, 1), lwant = log_softmax(ref, 1);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t row = i / 300;
    if (row == 1 || row == 3) {
      EXPECT_TRUE(std::isnan(y.at(i)) && std::isnan(ly.at(i))) << i;  // NaN row; +inf row is NaN in f64 too
      continue;
    }
    // Relative: a few ulp from exp and the sum, plus the rounding of x - max in float, which moves
    // exp by up to |x - max| * 2^-24 (about |ln p|, up to ~24 here).
    EXPECT_NEAR(y.at(i), want.at(i), want.at(i) * (1e-6 + 1e-7 * std::abs(std::log(want.at(i) + 1e-300)))) << i;
    if (std::isfinite(lwant.at(i))) {
      EXPECT_NEAR(ly.at(i), lwant.at(i), 1e-6 * std::max(1.0, std::abs(lwant.at(i)))) << i;
    }
  }
  for (int64_t j = 200; j < 300; ++j) EXPECT_EQ(y.at(j), 0.0) << "masked position " << j;
  EXPECT_EQ(y.at(600 + 7), 0.0);
  Tensor dy = random_f64(shape, 8);
  Tensor dx = softmax_backward(y, dy.to(DType::F32), 1), dx_want = softmax_backward(y.to(DType::F64), dy, 1);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (i / 300 == 1 || i / 300 == 3) continue;
    EXPECT_NEAR(dx.at(i), dx_want.at(i), 1e-6 * std::abs(dx_want.at(i)) + 1e-7) << i;
  }
  // Cross-entropy over the finite rows.
  Tensor logits = random_f64({5, 257}, 9, -8, 8);
  Tensor labels = i64({5}, {0, 256, 17, 100, 3});
  Tensor l32 = logits.to(DType::F32), l64 = l32.to(DType::F64);
  for (LossReduction r : {LossReduction::Sum, LossReduction::None}) {
    Tensor got = cross_entropy(l32, labels, -100, r), expect = cross_entropy(l64, labels, -100, r);
    for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.at(i), expect.at(i), 1e-6 * std::abs(expect.at(i)));
  }
  Tensor one = Tensor::scalar<float>(1.0f);
  Tensor g32 = cross_entropy_backward(l32, labels, one, -100, LossReduction::Sum);
  Tensor g64 = cross_entropy_backward(l64, labels, Tensor::scalar<double>(1.0), -100, LossReduction::Sum);
  for (int64_t i = 0; i < g32.numel(); ++i) EXPECT_NEAR(g32.at(i), g64.at(i), 1e-6 * std::abs(g64.at(i)) + 1e-9) << i;
}

using testing_util::numeric_grad;

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  Shape shape{2, 3, 4};
  for (int axis : {0, 1, 2}) {
    Tensor x = random_f64(shape, 3);
    Tensor w = random_f64(shape, 4);
    Tensor y = softmax(x, axis), ly = log_softmax(x, axis);
    expect_near(softmax_backward(y, w, axis), numeric_grad(x, w, [&] { return softmax(x, axis); }), 1e-7,
                "softmax dx");
    expect_near(log_softmax_backward(ly, w, axis), numeric_grad(x, w, [&] { return log_softmax(x, axis); }), 1e-7,
                "log_softmax dx");
  }
  EXPECT_THROW(softmax_backward(softmax(random_f64({2, 3}, 5), 1), random_f64({3, 2}, 6), 1), Error);
}

TEST(CrossEntropy, HandValues) {
  // Row 0 probabilities [1/6, 2/6, 3/6], label 2: loss ln 2. Row 1 uniform, label 0: loss ln 3.
  Tensor logits = f64({2, 3}, {0, std::log(2.0), std::log(3.0), 1, 1, 1});
  Tensor labels = i64({2}, {2, 0});
  expect_near(cross_entropy(logits, labels, -100, LossReduction::None), {std::log(2.0), std::log(3.0)}, 1e-15,
              "none");
  expect_near(cross_entropy(logits, labels, -100, LossReduction::Sum), {std::log(6.0)}, 1e-15, "sum");
  expect_near(cross_entropy(logits, labels, -100, LossReduction::Mean), {std::log(6.0) / 2}, 1e-15, "mean");
  // Ignoring class 0 drops row 1: it contributes 0 and the mean divides by 1.
  expect_near(cross_entropy(logits, labels, 0, LossReduction::None), {std::log(2.0), 0}, 1e-15, "none ignored");
  expect_near(cross_entropy(logits, labels, 0, LossReduction::Mean), {std::log(2.0)}, 1e-15, "mean ignored");
  // i32 labels, a scalar-label single sample.
  expect_near(cross_entropy(logits, labels.to(DType::I32), -100, LossReduction::Sum), {std::log(6.0)}, 1e-15, "i32");
  Tensor one = cross_entropy(f64({3}, {1, 1, 1}), Tensor::scalar<int64_t>(1), -100, LossReduction::None);
  EXPECT_EQ(one.ndim(), 0);
  EXPECT_NEAR(one.at(0), std::log(3.0), 1e-15);
  // Stable for large logits.
  expect_near(cross_entropy(f64({1, 2}, {1000, 0}), i64({1}, {1}), -100, LossReduction::Sum), {1000}, 1e-9, "large");
}

TEST(CrossEntropy, AllIgnoredMeanIsNaNAndGradientZero) {
  Tensor logits = random_f64({3, 4}, 7);
  Tensor labels = i64({3}, {-100, -100, -100});
  EXPECT_TRUE(std::isnan(cross_entropy(logits, labels, -100, LossReduction::Mean).at(0)));
  EXPECT_EQ(cross_entropy(logits, labels, -100, LossReduction::Sum).at(0), 0.0);
  Tensor dx = cross_entropy_backward(logits, labels, f64({}, {1.0}), -100, LossReduction::Mean);
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_EQ(dx.at(i), 0.0);
  // No rows at all: mean is NaN as well, sum 0, none empty.
  Tensor empty_logits(DType::F64, {0, 4});
  Tensor empty_labels(DType::I64, {0});
  EXPECT_TRUE(std::isnan(cross_entropy(empty_logits, empty_labels, -100, LossReduction::Mean).at(0)));
  EXPECT_EQ(cross_entropy(empty_logits, empty_labels, -100, LossReduction::Sum).at(0), 0.0);
  EXPECT_EQ(cross_entropy(empty_logits, empty_labels, -100, LossReduction::None).shape(), (Shape{0}));
}

TEST(CrossEntropy, RejectsBadArguments) {
  Tensor logits = random_f64({2, 3}, 8);
  EXPECT_THROW(cross_entropy(logits, i64({2}, {0, 3}), -100, LossReduction::Sum), Error);  // label == C
  EXPECT_THROW(cross_entropy(logits, i64({2}, {-1, 0}), -100, LossReduction::Sum), Error);
  EXPECT_THROW(cross_entropy(logits, i64({3}, {0, 0, 0}), -100, LossReduction::Sum), Error);  // shape
  EXPECT_THROW(cross_entropy(logits, logits, -100, LossReduction::Sum), Error);  // float labels
  EXPECT_THROW(cross_entropy(logits.to(DType::I64), i64({2}, {0, 0}), -100, LossReduction::Sum), Error);
  EXPECT_THROW(loss_reduction(Attrs{{"reduction", std::string("avg")}}, "t"), Error);
  EXPECT_EQ(loss_reduction(Attrs{}, "t"), LossReduction::Mean);
  EXPECT_EQ(loss_reduction(Attrs{{"reduction", std::string("none")}}, "t"), LossReduction::None);
  EXPECT_THROW(cross_entropy_backward(logits, i64({2}, {0, 1}), f64({2}, {1, 1}), -100, LossReduction::Sum), Error);
  try {
    cross_entropy(logits, i64({2}, {0, 7}), -100, LossReduction::Sum);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 7"), std::string::npos) << e.what();
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  Tensor logits = random_f64({2, 3, 4}, 9);
  Tensor labels = i64({2, 3}, {0, 3, 1, 1, 2, 3});  // ignore_index 1 drops two rows
  for (LossReduction r : {LossReduction::None, LossReduction::Sum, LossReduction::Mean}) {
    Tensor dloss = r == LossReduction::None ? random_f64({2, 3}, 10) : f64({}, {0.7});
    Tensor dx = cross_entropy_backward(logits, labels, dloss, 1, r);
    auto out = [&] { return cross_entropy(logits, labels, 1, r); };
    expect_near(dx, numeric_grad(logits, dloss, out), 1e-7, "dlogits");
  }
}

// The vocab-parallel pieces on class blocks of 2, 2, 1 and 0 (V = 5 over 4 ranks), combined as the
// collectives would (max of the maxima, sum of the sums), give cross_entropy and, block by block,
// its gradient.
TEST(CrossEntropy, ClassBlocksCombineToTheWholeRow) {
  Tensor logits = random_f64({3, 5}, 11);
  Tensor labels = i64({3}, {4, 0, 1});
  const int64_t ignore = 0;
  const int64_t offsets[] = {0, 2, 4, 5}, sizes[] = {2, 2, 1, 0};
  std::vector<Tensor> blocks;
  std::vector<double> mx(3, -std::numeric_limits<double>::infinity());
  for (int b = 0; b < 4; ++b) {
    blocks.push_back(logits.slice(std::vector<int64_t>{0, offsets[b]}, {3, sizes[b]}));
    std::vector<double> local = cross_entropy_local_max(blocks.back());
    for (size_t i = 0; i < 3; ++i) mx[i] = std::max(mx[i], local[i]);
  }
  EXPECT_EQ(cross_entropy_local_max(blocks[3])[0], -std::numeric_limits<double>::infinity());
  CrossEntropyRowSums sums{std::vector<double>(3, 0.0), std::vector<double>(3, 0.0)};
  for (int b = 0; b < 4; ++b) {
    CrossEntropyRowSums local = cross_entropy_local_sums(blocks[static_cast<size_t>(b)], labels, mx, ignore,
                                                         ClassShard{5, offsets[b]});
    // Only the block holding a row's label contributes its target logit.
    EXPECT_EQ(local.target[0] != 0, b == 2) << "block " << b;
    for (size_t i = 0; i < 3; ++i) {
      sums.sum_exp[i] += local.sum_exp[i];
      sums.target[i] += local.target[i];
    }
  }
  for (LossReduction r : {LossReduction::None, LossReduction::Sum, LossReduction::Mean}) {
    Tensor want = cross_entropy(logits, labels, ignore, r);
    Tensor got = cross_entropy_from_rows(labels, DType::F64, mx, sums, ignore, r);
    std::vector<double> w(static_cast<size_t>(want.numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = want.at(static_cast<int64_t>(i));
    expect_near(got, w, 1e-14, "loss");
    Tensor dloss = r == LossReduction::None ? random_f64({3}, 12) : f64({}, {0.7});
    Tensor dx = cross_entropy_backward(logits, labels, dloss, ignore, r);
    for (int b = 0; b < 3; ++b) {
      Tensor part = cross_entropy_backward_from_rows(blocks[static_cast<size_t>(b)], labels, dloss, mx, sums.sum_exp,
                                                     ignore, r, ClassShard{5, offsets[b]});
      Tensor ref = dx.slice(std::vector<int64_t>{0, offsets[b]}, {3, sizes[b]});
      std::vector<double> rv(static_cast<size_t>(ref.numel()));
      for (size_t i = 0; i < rv.size(); ++i) rv[i] = ref.at(static_cast<int64_t>(i));
      expect_near(part, rv, 1e-14, "dlogits block");
    }
  }
  // A label outside the GLOBAL classes is an Error on every block, so is a block outside them.
  EXPECT_THROW(cross_entropy_local_sums(blocks[0], i64({3}, {5, 0, 1}), mx, ignore, ClassShard{5, 0}), Error);
  EXPECT_THROW(cross_entropy_local_sums(blocks[0], labels, mx, ignore, ClassShard{5, 4}), Error);
  EXPECT_THROW(cross_entropy_from_rows(labels, DType::F64, std::vector<double>(2), sums, ignore, LossReduction::Sum),
               Error);
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_softmax_rules.cc)
namespace rule_tests {
using namespace spmd;
namespace {

using mesh::parse_dist;

const ProcessMesh kMesh22(Shape{2, 2});

std::string join(const std::vector<DistAttr>& dists) {
  std::string out;
  for (size_t i = 0; i < dists.size(); ++i) out += (i ? " | " : "") + dists[i].to_string();
  return out;
}

TensorSpec spec(Shape s, const std::string& dist, DType dtype = DType::F64) {
  return {s, dtype, parse_dist(dist, kMesh22.ndim())};
}

Attrs axis(int64_t a) { return Attrs{{"axis", a}}; }

std::string sm_fwd(Shape x, int64_t a, const std::string& d) {
  std::vector<TensorSpec> in = {spec(x, d)};
  SpmdResult r = op_registry().rule("softmax").forward(kMesh22, in, axis(a));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string sm_rev(Shape x, int64_t a, const std::string& want) {
  std::vector<TensorSpec> in = {spec(x, "R,R")}, out = {spec(x, want)};
  SpmdResult r = op_registry().rule("softmax").reverse(kMesh22, in, out, axis(a));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string sm_grad(Shape x, int64_t a, const std::string& dx, const std::string& dout, const std::string& ddout) {
  std::vector<TensorSpec> in = {spec(x, dx), spec(x, dout), spec(x, ddout)};
  SpmdResult r = op_registry().rule("softmax").grad(kMesh22, in, axis(a));
  return join(r.inputs) + " -> " + join(r.outputs);
}

TEST(SoftmaxRules, RegisteredWithSummaries) {
  for (const char* name : {"softmax", "cross_entropy", "vocab_parallel_cross_entropy"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "softmax") << name;
      }
    }
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(SoftmaxRules, AxisReplicatedOtherDimsKept) {
  EXPECT_EQ(sm_fwd({4, 6}, -1, "S(0),S(1)"), "S(0),R -> S(0),R");
  EXPECT_EQ(sm_fwd({4, 6}, 0, "S(0),S(1)"), "R,S(1) -> R,S(1)");
  EXPECT_EQ(sm_fwd({4, 6}, -1, "P(avg),S(0)"), "R,S(0) -> R,S(0)");
  EXPECT_EQ(sm_fwd({4, 6}, -1, "P(max),P(sum)"), "R,R -> R,R");
  EXPECT_EQ(sm_fwd({2, 3, 4}, 1, "S(1),S(2)"), "R,S(2) -> R,S(2)");
  EXPECT_EQ(sm_fwd({4, 6}, 1, "S(0)@1,S(0)@0"), "S(0)@1,S(0)@0 -> S(0)@1,S(0)@0");
  std::vector<TensorSpec> bad = {spec({4, 6}, "R,R")};
  EXPECT_THROW(op_registry().rule("softmax").forward(kMesh22, bad, axis(2)), Error);
}

TEST(SoftmaxRules, ReverseAndGrad) {
  EXPECT_EQ(sm_rev({4, 6}, -1, "S(1),P(sum)"), "R,R -> R,R");
  EXPECT_EQ(sm_rev({4, 6}, 0, "S(1),S(0)"), "S(1),R -> S(1),R");
  // x is not read (kept); out and dout merge (out first); dout P(avg) on the free mesh dim passes.
  EXPECT_EQ(sm_grad({4, 6}, -1, "P(max),S(1)", "S(0),R", "R,P(avg)"),
            "P(max),S(1) | S(0),R | S(0),P(avg) -> S(0),P(avg)");
  EXPECT_EQ(sm_grad({4, 6}, -1, "R,R", "R,S(0)", "S(0),P(sum)"), "R,R | R,S(0) | R,S(0) -> R,S(0)");
  EXPECT_EQ(sm_grad({4, 6}, 0, "R,R", "S(0),S(1)", "P(max),R"), "R,R | R,S(1) | R,S(1) -> R,S(1)");
}

Attrs ce(const char* reduction) { return Attrs{{"reduction", std::string(reduction)}}; }

Shape batch_of(const Shape& logits) {
  Shape s;
  for (int d = 0; d + 1 < logits.ndim(); ++d) s.push_back(logits[d]);
  return s;
}

constexpr const char* kVp = "vocab_parallel_cross_entropy";

std::string ce_fwd(Shape logits, const std::string& dl, const std::string& dy, const char* reduction,
                   const char* rule = "cross_entropy") {
  std::vector<TensorSpec> in = {spec(logits, dl), spec(batch_of(logits), dy, DType::I64)};
  SpmdResult r = op_registry().rule(rule).forward(kMesh22, in, ce(reduction));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string ce_rev(Shape logits, const std::string& dl, const std::string& want, const char* reduction,
                   const char* rule = "cross_entropy") {
  std::vector<TensorSpec> in = {spec(logits, dl), spec(batch_of(logits), "R,R", DType::I64)};
  Shape loss = std::string(reduction) == "none" ? batch_of(logits) : Shape{};
  std::vector<TensorSpec> out = {spec(loss, want)};
  SpmdResult r = op_registry().rule(rule).reverse(kMesh22, in, out, ce(reduction));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string ce_grad(Shape logits, std::vector<std::string> d, const char* reduction,
                    const char* rule = "cross_entropy") {
  Shape loss = std::string(reduction) == "none" ? batch_of(logits) : Shape{};
  std::vector<TensorSpec> in = {spec(logits, d[0]), spec(batch_of(logits), d[1], DType::I64), spec(loss, d[2]),
                                spec(loss, d[3])};
  SpmdResult r = op_registry().rule(rule).grad(kMesh22, in, ce(reduction));
  EXPECT_EQ(r.outputs.size(), 2u);
  return join(r.inputs) + " -> " + join(r.outputs);
}

TEST(CrossEntropyRules, ForwardPerReduction) {
  // The class dim is Replicate; a sharded batch gives P(sum) for sum, a sharded loss for none,
  // and is resharded for mean (the divisor is the global count of non-ignored labels).
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "sum"), "S(0),R | S(0),R -> P(sum),R");
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "none"), "S(0),R | S(0),R -> S(0),R");
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "S(0),R", "mean"), "R,R | R,R -> R,R");
  // labels define the batch sharding when logits do not; Partials are resharded.
  EXPECT_EQ(ce_fwd({4, 6}, "P(sum),R", "S(0),P(sum)", "none"), "S(0),R | S(0),R -> S(0),R");
  // logits win a conflict.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),R", "R,S(0)", "sum"), "S(0),R | S(0),R -> P(sum),R");
  // Two batch dims, each on its own mesh dim.
  EXPECT_EQ(ce_fwd({2, 3, 4}, "S(1),S(0)", "R,R", "sum"), "S(1),S(0) | S(1),S(0) -> P(sum),P(sum)");
  // Errors: labels of the wrong shape, an unknown reduction.
  std::vector<TensorSpec> bad = {spec({4, 6}, "R,R"), spec({6}, "R,R", DType::I64)};
  EXPECT_THROW(op_registry().rule("cross_entropy").forward(kMesh22, bad, ce("sum")), Error);
  std::vector<TensorSpec> good = {spec({4, 6}, "R,R"), spec({4}, "R,R", DType::I64)};
  EXPECT_THROW(op_registry().rule("cross_entropy").forward(kMesh22, good, ce("avg")), Error);
}

TEST(CrossEntropyRules, Reverse) {
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "P(sum),R", "sum"), "S(0),R | S(0),R -> P(sum),R");
  // The given logits' batch shard on a mesh dim is reused for the wanted P(sum) there.
  EXPECT_EQ(ce_rev({2, 3, 4}, "S(1),R", "P(sum),P(sum)", "sum"), "S(1),S(0) | S(1),S(0) -> P(sum),P(sum)");
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "P(max),R", "sum"), "R,R | R,R -> R,R");
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "R,S(0)", "none"), "R,S(0) | R,S(0) -> R,S(0)");
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "P(sum),S(0)", "none"), "R,S(0) | R,S(0) -> R,S(0)");
  EXPECT_EQ(ce_rev({4, 6}, "S(0),R", "P(sum),R", "mean"), "R,R | R,R -> R,R");
}

TEST(CrossEntropyRules, Grad) {
  // none: dloss joins the batch merge; its P(sum) on the free mesh dim passes to dlogits.
  EXPECT_EQ(ce_grad({4, 6}, {"R,R", "R,R", "P(sum),R", "S(0),P(sum)"}, "none"),
            "S(0),R | S(0),R | P(sum),R | S(0),P(sum) -> S(0),P(sum) | S(0),R");
  // sum: the scalar dloss is Replicate where the batch is sharded, P(avg) passes elsewhere.
  EXPECT_EQ(ce_grad({4, 6}, {"S(0),R", "R,R", "P(sum),R", "P(sum),P(avg)"}, "sum"),
            "S(0),R | S(0),R | P(sum),R | R,P(avg) -> S(0),P(avg) | S(0),R");
  // mean: everything Replicate; dloss P(sum) passes to dlogits.
  EXPECT_EQ(ce_grad({4, 6}, {"S(0),S(1)", "S(0),R", "R,R", "P(sum),P(max)"}, "mean"),
            "R,R | R,R | R,R | P(sum),R -> P(sum),R | R,R");
}

TEST(VocabParallelCrossEntropyRules, ClassDimStaysSharded) {
  // The class dim keeps its sharding (co-sharded too); labels and loss are Replicate on it.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "sum", kVp), "S(0),S(1) | S(0),R -> P(sum),R");
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "none", kVp), "S(0),S(1) | S(0),R -> S(0),R");
  EXPECT_EQ(ce_fwd({4, 5}, "S(1),S(1)", "S(0),R", "none", kVp), "S(1),S(1) | R,R -> R,R");
  // mean: the batch is Replicate (global divisor), the class dim is not.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "mean", kVp), "R,S(1) | R,R -> R,R");
  // Partial logits -> R; labels' batch sharding is taken where logits have none.
  EXPECT_EQ(ce_fwd({4, 6}, "P(sum),S(1)", "S(0),R", "sum", kVp), "S(0),S(1) | S(0),R -> P(sum),R");
  // The same inputs under cross_entropy lose the class sharding.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "sum"), "S(0),R | S(0),R -> P(sum),R");
}

TEST(VocabParallelCrossEntropyRules, ReverseKeepsTheGivenClassSharding) {
  EXPECT_EQ(ce_rev({4, 6}, "R,S(1)", "P(sum),R", "sum", kVp), "S(0),S(1) | S(0),R -> P(sum),R");
  EXPECT_EQ(ce_rev({4, 6}, "S(1),R", "R,R", "mean", kVp), "S(1),R | R,R -> R,R");
  // The wanted loss takes mesh dim 1 for the batch; the class keeps mesh dim 0.
  EXPECT_EQ(ce_rev({4, 6}, "S(1),S(1)", "R,S(0)", "none", kVp), "S(1),S(0) | R,S(0) -> R,S(0)");
}

TEST(VocabParallelCrossEntropyRules, Grad) {
  // dlogits keeps the class sharding; dloss (none) follows labels.
  EXPECT_EQ(ce_grad({4, 6}, {"R,S(1)", "R,R", "R,R", "S(0),R"}, "none", kVp),
            "S(0),S(1) | S(0),R | R,R | S(0),R -> S(0),S(1) | S(0),R");
  // A dloss Partial on the class-sharding mesh dim cannot pass: Replicate there.
  EXPECT_EQ(ce_grad({4, 6}, {"R,S(1)", "R,R", "R,R", "P(sum),P(sum)"}, "sum", kVp),
            "R,S(1) | R,R | R,R | P(sum),R -> P(sum),S(1) | R,R");
}

}  // namespace
}  // namespace rule_tests

}  // namespace shardwise::ops
