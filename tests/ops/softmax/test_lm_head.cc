// lm_head_cross_entropy (ops/softmax/lm_head.h): the fused, chunked LM head + cross-entropy.
//
// Kernels against a double-precision reference written here (logits z = h·Wᵀ by loops, loss_i =
// log Σ_c exp(z_ic) - z_i,y, dz = (softmax - onehot) * w, dh = dz·W, dW = dzᵀ·h) and central
// differences, with ignored rows and row counts that are not a multiple of the chunk; f32 against
// the unfused matmul + cross_entropy pair; the rules' placements for dp, tp and sp layouts.
// The vocab-parallel kernel on meshes (uneven vocab blocks) is in tests/ops/test_collective_ops.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/ops/numeric_grad.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/softmax/lm_head.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {
namespace {

Tensor random_t(DType dtype, const Shape& s, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Tensor t(dtype, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_at(i, d(gen));
  return t;
}

struct Ref {
  std::vector<double> loss;  // per row, 0 when ignored
  std::vector<double> dz;    // softmax - onehot per row (0 rows when ignored), [N, V]
  int64_t count = 0;
};

Ref reference(const Tensor& h, const Tensor& w, const std::vector<int64_t>& y, int64_t ignore) {
  const int64_t n = static_cast<int64_t>(y.size()), hid = w.shape()[1], v = w.shape()[0];
  Ref r{std::vector<double>(static_cast<size_t>(n), 0.0), std::vector<double>(static_cast<size_t>(n * v), 0.0), 0};
  for (int64_t i = 0; i < n; ++i) {
    if (y[static_cast<size_t>(i)] == ignore) continue;
    ++r.count;
    std::vector<double> z(static_cast<size_t>(v), 0.0);
    double mx = -INFINITY;
    for (int64_t c = 0; c < v; ++c) {
      for (int64_t k = 0; k < hid; ++k) z[static_cast<size_t>(c)] += h.at(i * hid + k) * w.at(c * hid + k);
      mx = std::max(mx, z[static_cast<size_t>(c)]);
    }
    double s = 0;
    for (double zc : z) s += std::exp(zc - mx);
    r.loss[static_cast<size_t>(i)] = mx + std::log(s) - z[static_cast<size_t>(y[static_cast<size_t>(i)])];
    for (int64_t c = 0; c < v; ++c) {
      r.dz[static_cast<size_t>(i * v + c)] =
          std::exp(z[static_cast<size_t>(c)] - mx) / s - (c == y[static_cast<size_t>(i)] ? 1.0 : 0.0);
    }
  }
  return r;
}

// N = 7 rows (two ignored), H = 5, V = 11; chunk_bytes for 3 f64 rows: chunks of 3, 3, 1.
struct Fixture {
  Tensor h = random_t(DType::F64, {7, 5}, 1);
  Tensor w = random_t(DType::F64, {11, 5}, 2);
  std::vector<int64_t> ids = {3, 0, 10, 7, 0, 5, 1};
  Tensor labels = Tensor::from<int64_t>({7}, ids);
  LmHeadArgs args(LossReduction r) const {
    LmHeadArgs a;
    a.ignore_index = 0;
    a.reduction = r;
    a.chunk_bytes = 3 * 11 * 8;
    return a;
  }
};

TEST(LmHeadCrossEntropy, ChunkRowsFollowTheByteBudget) {
  EXPECT_EQ(lm_head_chunk_rows(50257, DType::F32, int64_t{16} << 20), 83);
  EXPECT_EQ(lm_head_chunk_rows(11, DType::F64, 3 * 11 * 8), 3);
  EXPECT_EQ(lm_head_chunk_rows(11, DType::F64, 1), 1);  // at least one row
}

TEST(LmHeadCrossEntropy, LossEqualsTheDoubleReferenceInChunks) {
  Fixture f;
  Ref ref = reference(f.h, f.w, f.ids, 0);
  double total = 0;
  for (double l : ref.loss) total += l;
  Tensor none = lm_head_cross_entropy(f.h, f.w, f.labels, f.args(LossReduction::None));
  ASSERT_EQ(none.shape(), Shape{7});
  for (int64_t i = 0; i < 7; ++i) EXPECT_NEAR(none.at(i), ref.loss[static_cast<size_t>(i)], 1e-12) << i;
  EXPECT_EQ(none.at(1), 0.0);  // ignored
  EXPECT_NEAR(lm_head_cross_entropy(f.h, f.w, f.labels, f.args(LossReduction::Sum)).at(0), total, 1e-12);
  EXPECT_NEAR(lm_head_cross_entropy(f.h, f.w, f.labels, f.args(LossReduction::Mean)).at(0), total / 5.0, 1e-12);
  // 2-D rows ([N] = [7] as [1, 7]) and the default (one chunk) give the same values.
  LmHeadArgs one = f.args(LossReduction::Sum);
  one.chunk_bytes = kLmHeadChunkBytes;
  EXPECT_NEAR(lm_head_cross_entropy(f.h.reshaped({1, 7, 5}), f.w, f.labels.reshaped({1, 7}), one).at(0), total, 1e-12);
}

TEST(LmHeadCrossEntropy, GradientsEqualTheReferenceAndCentralDifferences) {
  Fixture f;
  Ref ref = reference(f.h, f.w, f.ids, 0);
  for (LossReduction r : {LossReduction::None, LossReduction::Sum, LossReduction::Mean}) {
    SCOPED_TRACE(static_cast<int>(r));
    Tensor dloss = r == LossReduction::None ? random_t(DType::F64, {7}, 9) : Tensor::from<double>({}, {1.7});
    auto [dh, dw] = lm_head_cross_entropy_backward(f.h, f.w, f.labels, dloss, f.args(r));
    ASSERT_EQ(dh.shape(), f.h.shape());
    ASSERT_EQ(dw.shape(), f.w.shape());
    std::vector<double> wrow(7);
    for (int64_t i = 0; i < 7; ++i) {
      wrow[static_cast<size_t>(i)] = r == LossReduction::None ? dloss.at(i) : dloss.at(0);
      if (r == LossReduction::Mean) wrow[static_cast<size_t>(i)] /= static_cast<double>(ref.count);
    }
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t k = 0; k < 5; ++k) {
        double want = 0;
        for (int64_t c = 0; c < 11; ++c) want += ref.dz[static_cast<size_t>(i * 11 + c)] * f.w.at(c * 5 + k);
        EXPECT_NEAR(dh.at(i * 5 + k), want * wrow[static_cast<size_t>(i)], 1e-12) << "dh " << i << "," << k;
      }
    }
    for (int64_t c = 0; c < 11; ++c) {
      for (int64_t k = 0; k < 5; ++k) {
        double want = 0;
        for (int64_t i = 0; i < 7; ++i) {
          want += ref.dz[static_cast<size_t>(i * 11 + c)] * f.h.at(i * 5 + k) * wrow[static_cast<size_t>(i)];
        }
        EXPECT_NEAR(dw.at(c * 5 + k), want, 1e-12) << "dW " << c << "," << k;
      }
    }
    // Central differences of sum(dloss * loss).
    Tensor h = f.h.clone(), w = f.w.clone();
    auto loss = [&] { return lm_head_cross_entropy(h, w, f.labels, f.args(r)); };
    std::vector<double> nh = testing_util::numeric_grad(h, dloss, loss), nw = testing_util::numeric_grad(w, dloss, loss);
    for (int64_t i = 0; i < h.numel(); ++i) EXPECT_NEAR(dh.at(i), nh[static_cast<size_t>(i)], 1e-6) << "dh " << i;
    for (int64_t i = 0; i < w.numel(); ++i) EXPECT_NEAR(dw.at(i), nw[static_cast<size_t>(i)], 1e-6) << "dW " << i;
  }
}

// The partial kernel (a frozen weight, zero-bubble's halves) gives the wanted gradient's same bits.
TEST(LmHeadCrossEntropy, PartialBackwardComputesOnlyTheWantedGradient) {
  Fixture f;
  const OpDef& op = op_registry().get("lm_head_cross_entropy");
  ASSERT_TRUE(op.backward_partial);
  Attrs attrs{{"reduction", std::string("sum")}, {"ignore_index", int64_t{0}}, {"chunk_bytes", int64_t{3 * 11 * 8}}};
  std::vector<Tensor> in{f.h, f.w, f.labels}, out{Tensor::from<double>({}, {0.0})}, dout{Tensor::from<double>({}, {1.3})};
  std::vector<Tensor> all = run_backward(op, in, out, dout, attrs);
  for (int k = 0; k < 2; ++k) {
    bool wanted[3] = {k == 0, k == 1, false};
    std::vector<Tensor> part = run_backward(op, in, out, dout, attrs, nullptr, wanted);
    EXPECT_FALSE(part[static_cast<size_t>(1 - k)].defined());
    CompareResult c = compare(part[static_cast<size_t>(k)], all[static_cast<size_t>(k)], 0, 0);
    EXPECT_TRUE(c.equal) << k << ": " << c.message;
  }
}

// forward_grads: the forward's dh and dW (for dloss = grad_scale) against the double reference,
// bit for bit the recomputing backward's (same chunks, same formula); the backward hands them back
// without a copy when dloss is grad_scale and rescales them otherwise.
TEST(LmHeadCrossEntropy, ForwardGradsEqualTheReferenceAndTheRecomputedBackward) {
  Fixture f;
  Ref ref = reference(f.h, f.w, f.ids, 0);
  for (LossReduction r : {LossReduction::Sum, LossReduction::Mean}) {
    SCOPED_TRACE(static_cast<int>(r));
    LmHeadArgs a = f.args(r);
    a.forward_grads = kLmHeadGradH | kLmHeadGradW;
    a.grad_scale = 1.7;
    std::vector<Tensor> out = lm_head_cross_entropy_outputs(f.h, f.w, f.labels, a);
    ASSERT_EQ(out.size(), 3u);
    ASSERT_EQ(out[1].shape(), f.h.shape());
    ASSERT_EQ(out[2].shape(), f.w.shape());
    EXPECT_TRUE(compare(out[0], lm_head_cross_entropy(f.h, f.w, f.labels, f.args(r)), 0, 0).equal);
    const double wgt = r == LossReduction::Mean ? 1.7 / static_cast<double>(ref.count) : 1.7;
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t k = 0; k < 5; ++k) {
        double dh = 0, dw = 0;
        for (int64_t c = 0; c < 11; ++c) dh += ref.dz[static_cast<size_t>(i * 11 + c)] * f.w.at(c * 5 + k);
        for (int64_t j = 0; j < 7; ++j) dw += ref.dz[static_cast<size_t>(j * 11 + i)] * f.h.at(j * 5 + k);
        EXPECT_NEAR(out[1].at(i * 5 + k), dh * wgt, 1e-12) << "dh " << i << "," << k;
        EXPECT_NEAR(out[2].at(i * 5 + k), dw * wgt, 1e-12) << "dW " << i << "," << k;  // classes 0..6
      }
    }
    const Tensor dloss = Tensor::from<double>({}, {1.7});
    auto [rh, rw] = lm_head_cross_entropy_backward(f.h, f.w, f.labels, dloss, f.args(r));
    EXPECT_TRUE(compare(out[1], rh, 0, 0).equal);
    EXPECT_TRUE(compare(out[2], rw, 0, 0).equal);
    auto [sh, sw] = lm_head_cross_entropy_backward(f.h, f.w, f.labels, dloss, a, {true, true}, {out[1], out[2]});
    EXPECT_EQ(sh.raw(), out[1].raw());  // no copy
    EXPECT_EQ(sw.raw(), out[2].raw());
    const Tensor other = Tensor::from<double>({}, {-0.6});
    auto [oh, ow] = lm_head_cross_entropy_backward(f.h, f.w, f.labels, other, a, {true, true}, {out[1], out[2]});
    auto [eh, ew] = lm_head_cross_entropy_backward(f.h, f.w, f.labels, other, f.args(r));
    for (int64_t i = 0; i < eh.numel(); ++i) EXPECT_NEAR(oh.at(i), eh.at(i), 1e-14) << "rescaled dh " << i;
    for (int64_t i = 0; i < ew.numel(); ++i) EXPECT_NEAR(ow.at(i), ew.at(i), 1e-14) << "rescaled dW " << i;
  }
}

// Only dh formed in the forward (a frozen head weight): one extra output; a dW asked for anyway is
// recomputed; an undefined W gradient is not.
TEST(LmHeadCrossEntropy, ForwardGradsOfOneInputRecomputeTheOther) {
  Fixture f;
  const OpDef& op = op_registry().get("lm_head_cross_entropy");
  Attrs attrs{{"reduction", std::string("sum")}, {"ignore_index", int64_t{0}}, {"chunk_bytes", int64_t{3 * 11 * 8}},
              {"forward_grads", int64_t{1}}, {"grad_scale", 0.5}};
  std::vector<Tensor> in{f.h, f.w, f.labels};
  std::vector<Tensor> out = run_forward(op, in, attrs);
  ASSERT_EQ(out.size(), 2u);
  std::vector<TensorMeta> in_meta{{f.h.shape(), DType::F64}, {f.w.shape(), DType::F64}, {f.labels.shape(), DType::I64}};
  std::vector<TensorMeta> metas = infer_checked(op, in_meta, attrs);
  ASSERT_EQ(metas.size(), 2u);
  EXPECT_EQ(metas[1].shape, f.h.shape());
  std::vector<Tensor> dout{Tensor::from<double>({}, {0.5}), Tensor(DType::F64, f.h.shape())};
  std::vector<Tensor> g = run_backward(op, in, out, dout, attrs);
  auto [rh, rw] = lm_head_cross_entropy_backward(f.h, f.w, f.labels, dout[0], f.args(LossReduction::Sum));
  EXPECT_EQ(g[0].raw(), out[1].raw());
  EXPECT_TRUE(compare(g[0], rh, 0, 0).equal);
  EXPECT_TRUE(compare(g[1], rw, 0, 0).equal);
  bool only_h[3] = {true, false, false};
  EXPECT_FALSE(run_backward(op, in, out, dout, attrs, nullptr, only_h)[1].defined());
}

// --compute bf16's head: bf16 h and W against the f32 op on the same values widened. The loss has
// the same rounding points (f32 products of the same values in the same f32 chunks, softmax and
// loss f32): the same bits, in f32. The gradients are bf16, rounded once at the end (2^-9 of |g|),
// and each chunk's dlogits dz·w are rounded to bf16 before the two gradient GEMMs where the f32 op
// keeps them f32 (2^-9 of each |dz·w·W| term): the bound below is twice both; the forward's
// gradients (forward_grads) are the recomputing backward's bits.
TEST(LmHeadCrossEntropy, Bf16InputsGiveTheF32LossAndBf16GradientsOfTheF32Op) {
  Fixture f;
  const Tensor hb = f.h.to(DType::BF16), wb = f.w.to(DType::BF16);
  const Tensor h32 = hb.to(DType::F32), w32 = wb.to(DType::F32);
  const Ref ref = reference(h32, w32, f.ids, 0);
  const OpDef& op = op_registry().get("lm_head_cross_entropy");
  for (const char* r : {"none", "sum", "mean"}) {
    SCOPED_TRACE(r);
    Attrs attrs{{"reduction", std::string(r)}, {"ignore_index", int64_t{0}}, {"chunk_bytes", int64_t{3 * 11 * 4}}};
    std::vector<Tensor> in{hb, wb, f.labels}, in32{h32, w32, f.labels};
    std::vector<TensorMeta> in_meta{{hb.shape(), DType::BF16}, {wb.shape(), DType::BF16}, {f.labels.shape(), DType::I64}};
    EXPECT_EQ(infer_checked(op, in_meta, attrs)[0].dtype, DType::F32);
    std::vector<Tensor> loss = run_forward(op, in, attrs), loss32 = run_forward(op, in32, attrs);
    ASSERT_EQ(loss[0].dtype(), DType::F32);
    CompareResult same = compare(loss[0], loss32[0], 0, 0);
    EXPECT_TRUE(same.equal) << same.message;
    const bool none = std::string(r) == "none";
    const Tensor dloss = none ? random_t(DType::F32, {7}, 9) : Tensor::from<float>({}, {1.7f});
    std::vector<Tensor> dout{dloss};
    std::vector<Tensor> g = run_backward(op, in, loss, dout, attrs), g32 = run_backward(op, in32, loss32, dout, attrs);
    ASSERT_EQ(g[0].dtype(), DType::BF16);
    ASSERT_EQ(g[1].dtype(), DType::BF16);
    std::vector<double> wrow(7);
    for (int64_t i = 0; i < 7; ++i) {
      wrow[static_cast<size_t>(i)] = (none ? dloss.at(i) : dloss.at(0)) / (std::string(r) == "mean" ? static_cast<double>(ref.count) : 1.0);
    }
    // |term| sums: dh (i, k) over the classes, dW (c, k) over the rows.
    auto bound = [](double want, double terms) { return 2 * std::ldexp(std::abs(want) + terms, -9) + 1e-6 * terms; };
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t k = 0; k < 5; ++k) {
        double terms = 0;
        for (int64_t c = 0; c < 11; ++c) terms += std::abs(ref.dz[static_cast<size_t>(i * 11 + c)] * wrow[static_cast<size_t>(i)] * w32.at(c * 5 + k));
        EXPECT_NEAR(g[0].at(i * 5 + k), g32[0].at(i * 5 + k), bound(g32[0].at(i * 5 + k), terms)) << "dh " << i << "," << k;
      }
    }
    for (int64_t c = 0; c < 11; ++c) {
      for (int64_t k = 0; k < 5; ++k) {
        double terms = 0;
        for (int64_t i = 0; i < 7; ++i) terms += std::abs(ref.dz[static_cast<size_t>(i * 11 + c)] * wrow[static_cast<size_t>(i)] * h32.at(i * 5 + k));
        EXPECT_NEAR(g[1].at(c * 5 + k), g32[1].at(c * 5 + k), bound(g32[1].at(c * 5 + k), terms)) << "dW " << c << "," << k;
      }
    }
    if (none) continue;
    attrs.set("forward_grads", int64_t{3});
    attrs.set("grad_scale", 1.7);
    std::vector<Tensor> fwd = run_forward(op, in, attrs);
    ASSERT_EQ(fwd.size(), 3u);
    EXPECT_TRUE(compare(fwd[0], loss[0], 0, 0).equal);
    for (size_t t = 0; t < 2; ++t) EXPECT_TRUE(compare(fwd[t + 1], g[t], 0, 0).equal) << t;
  }
}

TEST(LmHeadCrossEntropy, EveryLabelIgnoredGivesZeroGradientsAndPyTorchsMean) {
  Fixture f;
  Tensor labels = Tensor::from<int64_t>({7}, std::vector<int64_t>(7, 0));
  EXPECT_TRUE(std::isnan(lm_head_cross_entropy(f.h, f.w, labels, f.args(LossReduction::Mean)).at(0)));
  auto [dh, dw] = lm_head_cross_entropy_backward(f.h, f.w, labels, Tensor::from<double>({}, {1.0}),
                                                 f.args(LossReduction::Mean));
  for (int64_t i = 0; i < dh.numel(); ++i) EXPECT_EQ(dh.at(i), 0.0);
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_EQ(dw.at(i), 0.0);
}

// f32 at a head-like shape: the fused op against the registered matmul + cross_entropy pair.
TEST(LmHeadCrossEntropy, F32MatchesTheUnfusedPair) {
  Tensor h = random_t(DType::F32, {2, 37, 64}, 3, -2, 2), w = random_t(DType::F32, {301, 64}, 4, -0.5, 0.5);
  std::vector<int64_t> ids(74);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 301);
  ids[5] = -100;
  Tensor labels = Tensor::from<int64_t>({2, 37}, ids);
  Attrs attrs{{"reduction", std::string("sum")}, {"chunk_bytes", int64_t{10 * 301 * 4}}};
  std::vector<Tensor> in{h, w, labels};
  Tensor fused = run_forward(op_registry().get("lm_head_cross_entropy"), in, attrs)[0];
  std::vector<Tensor> mm{h, w};
  Tensor logits = run_forward(op_registry().get("matmul"), mm, {{"trans_y", true}})[0];
  std::vector<Tensor> ce{logits, labels};
  Tensor plain = run_forward(op_registry().get("cross_entropy"), ce, {{"reduction", std::string("sum")}})[0];
  EXPECT_NEAR(fused.at(0), plain.at(0), 1e-5 * std::abs(plain.at(0)));
  // Gradients: the pair's dlogits through matmul's backward.
  Tensor dloss = Tensor::from<float>({}, {0.25f});
  std::vector<Tensor> out{fused}, dout{dloss};
  std::vector<Tensor> g = run_backward(op_registry().get("lm_head_cross_entropy"), in, out, dout, attrs);
  std::vector<Tensor> ce_out{plain};
  Tensor dlogits = run_backward(op_registry().get("cross_entropy"), ce, ce_out, dout, {{"reduction", std::string("sum")}})[0];
  std::vector<Tensor> mm_out{logits}, mm_dout{dlogits};
  std::vector<Tensor> gm = run_backward(op_registry().get("matmul"), mm, mm_out, mm_dout, {{"trans_y", true}});
  for (int t = 0; t < 2; ++t) {
    double scale = 0;
    for (int64_t i = 0; i < gm[static_cast<size_t>(t)].numel(); ++i) scale = std::max(scale, std::abs(gm[static_cast<size_t>(t)].at(i)));
    for (int64_t i = 0; i < gm[static_cast<size_t>(t)].numel(); ++i) {
      ASSERT_NEAR(g[static_cast<size_t>(t)].at(i), gm[static_cast<size_t>(t)].at(i), 1e-5 * scale) << t << " " << i;
    }
  }
  EXPECT_FALSE(g[2].defined());
  // The gradients formed in the forward: the pair's too, and the recomputing backward's bits.
  attrs.set("forward_grads", int64_t{3});
  attrs.set("grad_scale", 0.25);
  std::vector<Tensor> fwd = run_forward(op_registry().get("lm_head_cross_entropy"), in, attrs);
  ASSERT_EQ(fwd.size(), 3u);
  EXPECT_TRUE(compare(fwd[0], fused, 0, 0).equal);
  for (int t = 0; t < 2; ++t) {
    CompareResult c = compare(fwd[static_cast<size_t>(t) + 1], g[static_cast<size_t>(t)], 0, 0);
    EXPECT_TRUE(c.equal) << t << ": " << c.message;
  }
}

TEST(LmHeadCrossEntropy, BadInputsAreErrorsNamingTheProblem) {
  Fixture f;
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { lm_head_cross_entropy(f.h, random_t(DType::F64, {11, 4}, 1), f.labels, f.args(LossReduction::Sum)); })
                .find("W must be [V, H]"),
            std::string::npos);
  Tensor bad = Tensor::from<int64_t>({7}, std::vector<int64_t>{3, 0, 11, 7, 0, 5, 1});
  EXPECT_NE(message([&] { lm_head_cross_entropy(f.h, f.w, bad, f.args(LossReduction::Sum)); }).find("label 11 at position 2"),
            std::string::npos);
  EXPECT_NE(message([&] { lm_head_args({{"chunk_bytes", int64_t{0}}}, "lm_head_cross_entropy"); }).find("chunk_bytes"),
            std::string::npos);
  EXPECT_NE(message([&] { lm_head_args({{"forward_grads", int64_t{4}}}, "lm_head_cross_entropy"); })
                .find("forward_grads must be 0-3"),
            std::string::npos);
  EXPECT_NE(message([&] {
              lm_head_args({{"forward_grads", int64_t{3}}, {"reduction", std::string("none")}}, "lm_head_cross_entropy");
            }).find("forward_grads needs reduction \"sum\" or \"mean\""),
            std::string::npos);
  EXPECT_NE(message([&] { lm_head_args({{"grad_scale", 0.0}}, "lm_head_cross_entropy"); }).find("grad_scale must be"),
            std::string::npos);
}

// ---- rules

using mesh::DistAttr;
using mesh::ProcessMesh;
using spmd::TensorSpec;

TensorSpec spec(const Shape& s, DType dt, const char* dist, int nd) { return {s, dt, mesh::parse_dist(dist, nd)}; }

TEST(LmHeadCrossEntropyRule, DataTensorAndSequenceParallelLayouts) {
  const spmd::Rule& vp = op_registry().rule("vocab_parallel_lm_head_cross_entropy");
  const spmd::Rule& plain = op_registry().rule("lm_head_cross_entropy");
  Attrs sum{{"reduction", std::string("sum")}};
  ProcessMesh m22(Shape{2, 2});  // dim 0 dp, dim 1 tp
  std::vector<TensorSpec> in{spec({4, 6, 8}, DType::F32, "S(0),S(1)", 2), spec({10, 8}, DType::F32, "R,S(0)", 2),
                             spec({4, 6}, DType::I64, "S(0),R", 2)};
  // sp: h sequence-sharded over tp loses to W's vocab sharding (h gathered, never the weight).
  spmd::SpmdResult r = vp.forward(m22, in, sum);
  EXPECT_EQ(r.inputs[0].to_string(), "S(0),R");
  EXPECT_EQ(r.inputs[1].to_string(), "R,S(0)");
  EXPECT_EQ(r.inputs[2].to_string(), "S(0),R");
  EXPECT_EQ(r.outputs[0].to_string(), "P(sum),R");
  // Not vocab-parallel: the vocab is gathered, the sequence stays sharded.
  r = plain.forward(m22, in, sum);
  EXPECT_EQ(r.inputs[0].to_string(), "S(0),S(1)");
  EXPECT_EQ(r.inputs[1].to_string(), "R,R");
  EXPECT_EQ(r.outputs[0].to_string(), "P(sum),P(sum)");
  // Grad: dh Partial over the vocab blocks, dW Partial over the batch blocks.
  std::vector<TensorSpec> g{in[0], in[1], in[2], spec({}, DType::F32, "P(sum),R", 2), spec({}, DType::F32, "R,R", 2)};
  r = vp.grad(m22, g, sum);
  EXPECT_EQ(r.inputs[0].to_string(), "S(0),R");
  EXPECT_EQ(r.outputs[0].to_string(), "S(0),P(sum)");
  EXPECT_EQ(r.outputs[1].to_string(), "P(sum),S(0)");
  // forward_grads: the extra outputs are laid out as those gradients; in the grad rule they are read
  // as made, their own grads (never read) laid out as them.
  Attrs fg{{"reduction", std::string("sum")}, {"forward_grads", int64_t{3}}, {"grad_scale", 0.5}};
  r = vp.forward(m22, in, fg);
  ASSERT_EQ(r.outputs.size(), 3u);
  EXPECT_EQ(r.outputs[1].to_string(), "S(0),P(sum)");
  EXPECT_EQ(r.outputs[2].to_string(), "P(sum),S(0)");
  std::vector<TensorSpec> g3{in[0], in[1], in[2], spec({}, DType::F32, "P(sum),R", 2),
                             spec({4, 6, 8}, DType::F32, "S(0),P(sum)", 2), spec({10, 8}, DType::F32, "P(sum),S(0)", 2),
                             spec({}, DType::F32, "R,R", 2), spec({4, 6, 8}, DType::F32, "R,R", 2),
                             spec({10, 8}, DType::F32, "R,S(1)", 2)};
  r = vp.grad(m22, g3, fg);
  ASSERT_EQ(r.inputs.size(), 9u);
  EXPECT_EQ(r.inputs[4].to_string(), "S(0),P(sum)");
  EXPECT_EQ(r.inputs[5].to_string(), "P(sum),S(0)");
  EXPECT_EQ(r.inputs[7].to_string(), "S(0),P(sum)");
  EXPECT_EQ(r.inputs[8].to_string(), "P(sum),S(0)");
  EXPECT_EQ(r.outputs[0].to_string(), "S(0),P(sum)");
  EXPECT_EQ(r.outputs[1].to_string(), "P(sum),S(0)");
  // A hidden-sharded h is gathered (the contraction happens inside the kernel); "mean" gathers rows.
  std::vector<TensorSpec> hid{spec({4, 8}, DType::F32, "S(1),R", 2), spec({10, 8}, DType::F32, "S(1),S(0)", 2),
                              spec({4}, DType::I64, "R,R", 2)};
  r = vp.forward(m22, hid, {{"reduction", std::string("mean")}});
  EXPECT_EQ(r.inputs[0].to_string(), "R,R");
  EXPECT_EQ(r.inputs[1].to_string(), "R,S(0)");
  EXPECT_EQ(r.outputs[0].to_string(), "R,R");
}

}  // namespace
}  // namespace shardwise::ops
