// The channel_norm family: its kernels, SPMD rules and registry entries tested side by side.
//
// Channel-normalization kernels against hand values, naive references (every element's channel /
// group found by div/mod of its multi-index, two-pass mean and variance) and f64 central finite
// differences of a weighted-sum loss for the gradients.
//
// Channel-normalization rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/channel_norm/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_channel_norm.cc)
namespace kernel_tests {
namespace {

Tensor random(const Shape& s, uint32_t seed, double lo = -2, double hi = 2, DType dtype = DType::F64) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor t(dtype, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_at(i, dist(gen));
  return t;
}

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }

std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int d = s.ndim() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    EXPECT_NEAR(got.at(i), want.at(i), tol) << what << " element " << i;
  }
}

// ---- naive references: a "key" per element (its statistics bucket), two-pass statistics.

struct Naive {
  Tensor out;
  std::vector<double> mean, var;  // per bucket
};

// key(idx) gives the bucket of the element at multi-index idx; chan(idx) its channel.
Naive naive_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, int64_t buckets, double eps,
                 const std::function<int64_t(const std::vector<int64_t>&)>& key,
                 const std::function<int64_t(const std::vector<int64_t>&)>& chan) {
  Naive r;
  std::vector<double> sum(static_cast<size_t>(buckets)), cnt(static_cast<size_t>(buckets));
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto k = static_cast<size_t>(key(unravel(i, x.shape())));
    sum[k] += x.at(i);
    cnt[k] += 1;
  }
  r.mean.resize(sum.size());
  r.var.assign(sum.size(), 0.0);
  for (size_t k = 0; k < sum.size(); ++k) r.mean[k] = sum[k] / cnt[k];
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto k = static_cast<size_t>(key(unravel(i, x.shape())));
    r.var[k] += (x.at(i) - r.mean[k]) * (x.at(i) - r.mean[k]) / cnt[k];
  }
  r.out = Tensor(x.dtype(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unravel(i, x.shape());
    auto k = static_cast<size_t>(key(idx));
    int64_t c = chan(idx);
    r.out.set_at(i, (x.at(i) - r.mean[k]) / std::sqrt(r.var[k] + eps) * scale.at(c) + bias.at(c));
  }
  return r;
}

// Central differences of L = sum(f(t) * w) with respect to every element of t.
Tensor finite_diff(Tensor t, const Tensor& w, const std::function<Tensor(const Tensor&)>& f) {
  const double h = 1e-6;
  Tensor g(DType::F64, t.shape());
  auto loss = [&](const Tensor& v) {
    Tensor out = f(v);
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += out.at(i) * w.at(i);
    return s;
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    Tensor p = t.clone(), m = t.clone();
    p.set_at(i, t.at(i) + h);
    m.set_at(i, t.at(i) - h);
    g.set_at(i, (loss(p) - loss(m)) / (2 * h));
  }
  return g;
}

// ---- batch_norm

TEST(BatchNorm, HandValuesAndRunningUpdate) {
  // N = 4, C = 1: mean 2.5, biased var 1.25, unbiased 5/3.
  Tensor x = f64({4, 1}, {1, 2, 3, 4});
  BatchNormOptions o;
  o.epsilon = 0;
  o.momentum = 0.9;
  BatchNormOutputs r = batch_norm(x, f64({1}, {2}), f64({1}, {1}), f64({1}, {0.5}), f64({1}, {1}), o);
  double rstd = 1 / std::sqrt(1.25);
  EXPECT_NEAR(r.out.at(0), (1 - 2.5) * rstd * 2 + 1, 1e-12);
  EXPECT_NEAR(r.out.at(3), (4 - 2.5) * rstd * 2 + 1, 1e-12);
  EXPECT_NEAR(r.saved_mean.at(0), 2.5, 1e-12);
  EXPECT_NEAR(r.saved_rstd.at(0), rstd, 1e-12);
  EXPECT_NEAR(r.running_mean.at(0), 0.9 * 0.5 + 0.1 * 2.5, 1e-12);
  EXPECT_NEAR(r.running_var.at(0), 0.9 * 1 + 0.1 * 5.0 / 3.0, 1e-12);
}

TEST(BatchNorm, TrainingMatchesNaiveBothFormats) {
  struct Case {
    Shape x;
    bool last;
  };
  for (const Case& c : {Case{{5, 3}, false}, Case{{2, 3, 4}, false}, Case{{2, 3, 2, 2}, false},
                        Case{{3, 2, 4}, true}, Case{{2, 2, 2, 3}, true}, Case{{2, 3, 1, 2, 2}, false}}) {
    int ca = c.last ? c.x.ndim() - 1 : 1;
    int64_t C = c.x[ca];
    Tensor x = random(c.x, 1), scale = random({C}, 2), bias = random({C}, 3), rm = random({C}, 4),
           rv = random({C}, 5, 0.5, 2);
    BatchNormOptions o;
    o.channels_last = c.last;
    o.momentum = 0.7;
    o.epsilon = 1e-3;
    BatchNormOutputs r = batch_norm(x, scale, bias, rm, rv, o);
    auto chan = [&](const std::vector<int64_t>& idx) { return idx[static_cast<size_t>(ca)]; };
    Naive n = naive_norm(x, scale, bias, C, 1e-3, chan, chan);
    expect_close(r.out, n.out, 1e-12, "out");
    double count = static_cast<double>(x.numel() / C);
    for (int64_t k = 0; k < C; ++k) {
      auto u = static_cast<size_t>(k);
      EXPECT_NEAR(r.saved_mean.at(k), n.mean[u], 1e-12);
      EXPECT_NEAR(r.saved_rstd.at(k), 1 / std::sqrt(n.var[u] + 1e-3), 1e-12);
      EXPECT_NEAR(r.running_mean.at(k), 0.7 * rm.at(k) + 0.3 * n.mean[u], 1e-12);
      EXPECT_NEAR(r.running_var.at(k), 0.7 * rv.at(k) + 0.3 * n.var[u] * count / (count - 1), 1e-12);
    }
  }
}

TEST(BatchNorm, InferenceUsesRunningStatsAndPassesThemThrough) {
  Tensor x = random({3, 4, 2}, 7), scale = random({4}, 8), bias = random({4}, 9), rm = random({4}, 10),
         rv = random({4}, 11, 0.5, 2);
  BatchNormOptions o;
  o.training = false;
  BatchNormOutputs r = batch_norm(x, scale, bias, rm, rv, o);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t c = unravel(i, x.shape())[1];
    EXPECT_NEAR(r.out.at(i), (x.at(i) - rm.at(c)) / std::sqrt(rv.at(c) + 1e-5) * scale.at(c) + bias.at(c), 1e-12);
  }
  expect_close(r.running_mean, rm, 0, "running_mean");
  expect_close(r.running_var, rv, 0, "running_var");
  expect_close(r.saved_mean, rm, 0, "saved_mean");
  for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(r.saved_rstd.at(c), 1 / std::sqrt(rv.at(c) + 1e-5), 1e-12);
}

TEST(BatchNorm, GradientsMatchFiniteDifferences) {
  for (bool training : {true, false}) {
    for (bool last : {false, true}) {
      Shape xs = last ? Shape{3, 2, 3} : Shape{3, 3, 2};
      Tensor x = random(xs, 20), scale = random({3}, 21), bias = random({3}, 22), rm = random({3}, 23),
             rv = random({3}, 24, 0.5, 2), w = random(xs, 25);
      BatchNormOptions o;
      o.training = training;
      o.channels_last = last;
      BatchNormOutputs r = batch_norm(x, scale, bias, rm, rv, o);
      NormGrads g = batch_norm_backward(x, scale, r.saved_mean, r.saved_rstd, w, o);
      auto out_of = [&](const Tensor& xv, const Tensor& sv, const Tensor& bv) {
        return batch_norm(xv, sv, bv, rm, rv, o).out;
      };
      expect_close(g.dx, finite_diff(x, w, [&](const Tensor& v) { return out_of(v, scale, bias); }), 1e-6, "dx");
      expect_close(g.dscale, finite_diff(scale, w, [&](const Tensor& v) { return out_of(x, v, bias); }), 1e-6,
                   "dscale");
      expect_close(g.dbias, finite_diff(bias, w, [&](const Tensor& v) { return out_of(x, scale, v); }), 1e-6,
                   "dbias");
    }
  }
}

// The sync_batch_norm contract: sums of batch slices add up to the global sums, and the gradient
// computed per slice from the all-reduced gradient sums is the slice of the global gradient.
TEST(BatchNorm, LocalSumsCombineAcrossBatchSlices) {
  Tensor x = random({5, 3, 2}, 30), dy = random({5, 3, 2}, 31), scale = random({3}, 32), bias = random({3}, 33),
         rm = random({3}, 34), rv = random({3}, 35, 0.5, 2);
  BatchNormOptions o;
  BatchNormOutputs global = batch_norm(x, scale, bias, rm, rv, o);
  NormGrads gg = batch_norm_backward(x, scale, global.saved_mean, global.saved_rstd, dy, o);
  std::vector<int64_t> at0{0, 0, 0}, at2{2, 0, 0};
  Tensor x0 = x.slice(at0, {2, 3, 2}), x1 = x.slice(at2, {3, 3, 2});
  Tensor d0 = dy.slice(at0, {2, 3, 2}), d1 = dy.slice(at2, {3, 3, 2});
  ChannelSums s0 = batch_norm_local_sums(x0, false), s1 = batch_norm_local_sums(x1, false);
  ChannelSums all = batch_norm_local_sums(x, false);
  EXPECT_EQ(s0.count + s1.count, all.count);
  ChannelSums merged = s0;
  merged.count += s1.count;
  for (size_t c = 0; c < 3; ++c) {
    merged.sum[c] += s1.sum[c];
    merged.sum_sq[c] += s1.sum_sq[c];
    EXPECT_NEAR(merged.sum[c], all.sum[c], 1e-12);
  }
  ChannelStats st = batch_norm_stats(merged);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(st.mean[static_cast<size_t>(c)], global.saved_mean.at(c), 1e-12);
    EXPECT_NEAR(1 / std::sqrt(st.var[static_cast<size_t>(c)] + o.epsilon), global.saved_rstd.at(c), 1e-12);
  }
  ChannelGradSums g0 = batch_norm_local_grad_sums(x0, d0, global.saved_mean, global.saved_rstd, false);
  ChannelGradSums g1 = batch_norm_local_grad_sums(x1, d1, global.saved_mean, global.saved_rstd, false);
  for (size_t c = 0; c < 3; ++c) {
    g0.sum_dy[c] += g1.sum_dy[c];
    g0.sum_dy_xhat[c] += g1.sum_dy_xhat[c];
  }
  NormGrads p1 = batch_norm_backward_from_sums(x1, scale, global.saved_mean, global.saved_rstd, d1, g0, all.count, o);
  expect_close(p1.dx, gg.dx.slice(at2, {3, 3, 2}), 1e-12, "dx of the second slice");
  expect_close(p1.dscale, gg.dscale, 1e-12, "dscale from all-reduced sums");
  expect_close(p1.dbias, gg.dbias, 1e-12, "dbias from all-reduced sums");
}

// sync_batch_norm's forward contract: moments of uneven batch slices (one empty) merged in order
// give the two-pass mean and M2 of the whole batch, and batch_norm_with_stats on them is batch_norm.
TEST(BatchNorm, MomentsMergeAcrossUnevenSlices) {
  Tensor x = random({7, 3, 2}, 50), scale = random({3}, 51), bias = random({3}, 52), rm = random({3}, 53),
         rv = random({3}, 54, 0.5, 2);
  ChannelMoments merged = batch_norm_local_moments(x.slice(std::vector<int64_t>{0, 0, 0}, {3, 3, 2}), false);
  for (auto [at, rows] : {std::pair<int64_t, int64_t>{3, 0}, {3, 4}}) {
    Tensor part = x.slice(std::vector<int64_t>{at, 0, 0}, {rows, 3, 2});
    merge_channel_moments(merged, batch_norm_local_moments(part, false));
  }
  auto chan = [](const std::vector<int64_t>& idx) { return idx[1]; };
  Naive n = naive_norm(x, scale, bias, 3, 1e-5, chan, chan);
  EXPECT_EQ(merged.count, 14);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(merged.mean[c], n.mean[c], 1e-13);
    EXPECT_NEAR(merged.m2[c], n.var[c] * 14, 1e-12);
  }
  BatchNormOptions o;
  o.momentum = 0.6;
  BatchNormOutputs want = batch_norm(x, scale, bias, rm, rv, o);
  BatchNormOutputs got = batch_norm_with_stats(x, scale, bias, rm, rv, batch_norm_stats(merged), merged.count, o);
  expect_close(got.out, want.out, 1e-12, "out");
  expect_close(got.running_mean, want.running_mean, 1e-12, "running_mean");
  expect_close(got.running_var, want.running_var, 1e-12, "running_var");
  expect_close(got.saved_rstd, want.saved_rstd, 1e-12, "saved_rstd");
  // Empty moments: a no-op when merged, NaN statistics on their own.
  ChannelMoments empty = batch_norm_local_moments(Tensor(DType::F64, {0, 3}), false);
  EXPECT_EQ(empty.count, 0);
  EXPECT_TRUE(std::isnan(batch_norm_stats(empty).var[0]));
  ChannelMoments copy = merged;
  merge_channel_moments(copy, empty);
  EXPECT_EQ(copy.mean, merged.mean);
  EXPECT_EQ(copy.m2, merged.m2);
}

// Far from zero (|mean| = 1e8, std ~ 0.6) the variance from E[x^2] - E[x]^2 keeps no correct digit;
// the merged two-pass moments keep about eight.
TEST(BatchNorm, MomentsStayAccurateFarFromZero) {
  Tensor x = random({64, 1}, 55, 1e8 - 1, 1e8 + 1);
  ChannelMoments m = batch_norm_local_moments(x.slice(std::vector<int64_t>{0, 0}, {40, 1}), false);
  merge_channel_moments(m, batch_norm_local_moments(x.slice(std::vector<int64_t>{40, 0}, {24, 1}), false));
  long double mean = 0, m2 = 0;
  for (int64_t i = 0; i < 64; ++i) mean += x.at(i);
  mean /= 64;
  for (int64_t i = 0; i < 64; ++i) m2 += (x.at(i) - mean) * (x.at(i) - mean);
  double var = static_cast<double>(m2 / 64);
  EXPECT_NEAR(batch_norm_stats(m).var[0], var, 1e-8 * var);
  EXPECT_NEAR(m.mean[0], static_cast<double>(mean), 1e-6);
}

TEST(BatchNorm, WithStatsErrors) {
  Tensor x = random({3, 2}, 56), p = f64({2}, {1, 1});
  BatchNormOptions o;
  ChannelStats st{{0, 0}, {1, 1}};
  EXPECT_THROW(batch_norm_with_stats(x, p, p, p, p, st, 1, o, "sync_batch_norm"), Error);  // count <= 1
  EXPECT_THROW(batch_norm_with_stats(x, p, p, p, p, ChannelStats{{0}, {1}}, 6, o), Error);  // 1 stat, 2 channels
  ChannelMoments two = batch_norm_local_moments(x, false);
  EXPECT_THROW(merge_channel_moments(two, batch_norm_local_moments(random({3, 3}, 57), false)), Error);
  try {
    batch_norm_with_stats(x, p, p, p, p, st, 1, o, "sync_batch_norm");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sync_batch_norm: training needs more than 1 value"), std::string::npos);
  }
}

TEST(BatchNorm, EmptyAndMixedPrecision) {
  BatchNormOptions o;
  // No channels: everything is empty, nothing fails.
  BatchNormOutputs e = batch_norm(Tensor(DType::F64, {4, 0}), Tensor(DType::F64, {0}), Tensor(DType::F64, {0}),
                                  Tensor(DType::F64, {0}), Tensor(DType::F64, {0}), o);
  EXPECT_EQ(e.out.shape(), (Shape{4, 0}));
  EXPECT_EQ(e.saved_rstd.shape(), (Shape{0}));
  // Inference on an empty batch: empty out, running stats passed through.
  o.training = false;
  Tensor rm = f64({2}, {0.5, -1}), rv = f64({2}, {1, 2});
  BatchNormOutputs ie = batch_norm(Tensor(DType::F64, {0, 2, 3}), f64({2}, {1, 1}), f64({2}, {0, 0}), rm, rv, o);
  EXPECT_EQ(ie.out.numel(), 0);
  expect_close(ie.running_var, rv, 0, "running_var");
  // f16 x with f32 parameters; f32 everywhere.
  o.training = true;
  Tensor x = random({4, 3}, 40);
  Tensor p1 = Tensor::full(DType::F32, {3}, 1), p0 = Tensor::full(DType::F32, {3}, 0);
  BatchNormOutputs h = batch_norm(x.to(DType::F16), p1, p0, p0, p1, o);
  EXPECT_EQ(h.out.dtype(), DType::F16);
  EXPECT_EQ(h.saved_mean.dtype(), DType::F32);
  BatchNormOutputs ref = batch_norm(x, p1.to(DType::F64), p0.to(DType::F64), p0.to(DType::F64), p1.to(DType::F64), o);
  expect_close(h.out, ref.out, 2e-2, "f16 out");
  BatchNormOutputs f = batch_norm(x.to(DType::F32), p1, p0, p0, p1, o);
  expect_close(f.out, ref.out, 1e-5, "f32 out");
}

TEST(BatchNorm, Errors) {
  BatchNormOptions o;
  Tensor p = f64({2}, {1, 1});
  EXPECT_THROW(batch_norm(f64({1, 2}, {1, 2}), p, p, p, p, o), Error);  // one value per channel
  EXPECT_THROW(batch_norm(random({3, 2}, 1), f64({3}, {1, 1, 1}), p, p, p, o), Error);
  EXPECT_THROW(batch_norm(random({3, 2}, 1), p.to(DType::F32), p, p, p, o), Error);
  EXPECT_THROW(batch_norm(random({3, 2}, 1, -2, 2, DType::I64), p, p, p, p, o), Error);
  EXPECT_THROW(batch_norm_options(Attrs{{"data_format", std::string("NWCH")}}), Error);
  EXPECT_TRUE(batch_norm_options(Attrs{{"data_format", std::string("NHWC")}}).channels_last);
  EXPECT_FALSE(batch_norm_options(Attrs{{"training", false}}).training);
  o.training = false;
  EXPECT_NO_THROW(batch_norm(f64({1, 2}, {1, 2}), p, p, p, p, o));  // inference needs no batch statistics
}

// ---- group_norm

Naive naive_group(const Tensor& x, const Tensor& scale, const Tensor& bias, int64_t groups, bool last, double eps) {
  int ca = last ? x.ndim() - 1 : 1;
  int64_t C = x.shape()[ca];
  int64_t cpg = C / groups;
  auto chan = [=](const std::vector<int64_t>& idx) { return idx[static_cast<size_t>(ca)]; };
  auto key = [=](const std::vector<int64_t>& idx) { return idx[0] * groups + idx[static_cast<size_t>(ca)] / cpg; };
  return naive_norm(x, scale, bias, x.shape()[0] * groups, eps, key, chan);
}

TEST(GroupNorm, MatchesNaiveBothFormats) {
  struct Case {
    Shape x;
    int64_t groups;
    bool last;
  };
  for (const Case& c : {Case{{2, 6, 3}, 3, false}, Case{{2, 6, 3}, 2, false}, Case{{3, 2, 6}, 3, true},
                        Case{{2, 4, 2, 2}, 1, false}, Case{{2, 4, 2, 2}, 4, false}, Case{{3, 6}, 2, false},
                        Case{{2, 2, 2, 4}, 2, true}}) {
    int64_t C = c.x[c.last ? c.x.ndim() - 1 : 1];
    Tensor x = random(c.x, 50), scale = random({C}, 51), bias = random({C}, 52);
    GroupNormOptions o{c.groups, 1e-4, c.last};
    NormOutputs r = group_norm(x, scale, bias, o);
    Naive n = naive_group(x, scale, bias, c.groups, c.last, 1e-4);
    expect_close(r.out, n.out, 1e-12, "out");
    ASSERT_EQ(r.mean.shape(), (Shape{c.x[0], c.groups}));
    for (int64_t k = 0; k < r.mean.numel(); ++k) {
      EXPECT_NEAR(r.mean.at(k), n.mean[static_cast<size_t>(k)], 1e-12);
      EXPECT_NEAR(r.rstd.at(k), 1 / std::sqrt(n.var[static_cast<size_t>(k)] + 1e-4), 1e-12);
    }
  }
}

TEST(GroupNorm, GradientsMatchFiniteDifferences) {
  for (bool last : {false, true}) {
    Shape xs = last ? Shape{2, 3, 4} : Shape{2, 4, 3};
    Tensor x = random(xs, 60), scale = random({4}, 61), bias = random({4}, 62), w = random(xs, 63);
    GroupNormOptions o{2, 1e-5, last};
    NormOutputs r = group_norm(x, scale, bias, o);
    NormGrads g = group_norm_backward(x, scale, r.mean, r.rstd, w, o);
    auto out_of = [&](const Tensor& xv, const Tensor& sv, const Tensor& bv) { return group_norm(xv, sv, bv, o).out; };
    expect_close(g.dx, finite_diff(x, w, [&](const Tensor& v) { return out_of(v, scale, bias); }), 1e-6, "dx");
    expect_close(g.dscale, finite_diff(scale, w, [&](const Tensor& v) { return out_of(x, v, bias); }), 1e-6, "dscale");
    expect_close(g.dbias, finite_diff(bias, w, [&](const Tensor& v) { return out_of(x, scale, v); }), 1e-6, "dbias");
  }
}

// A rank holding whole groups computes exactly its slice of the global result.
TEST(GroupNorm, ChannelShardOnGroupBoundaries) {
  Tensor x = random({2, 6, 3}, 70), scale = random({6}, 71), bias = random({6}, 72), dy = random({2, 6, 3}, 73);
  GroupNormOptions o{3, 1e-5, false};  // 2 channels per group
  NormOutputs global = group_norm(x, scale, bias, o);
  NormGrads gg = group_norm_backward(x, scale, global.mean, global.rstd, dy, o);
  std::vector<int64_t> xo{0, 2, 0}, po{2}, so{0, 1};
  Tensor xl = x.slice(xo, {2, 4, 3}), sl = scale.slice(po, {4}), bl = bias.slice(po, {4});
  NormOutputs local = group_norm(xl, sl, bl, o, {6, 2});
  expect_close(local.out, global.out.slice(xo, {2, 4, 3}), 0, "local out");
  expect_close(local.mean, global.mean.slice(so, {2, 2}), 0, "local mean");
  NormGrads gl = group_norm_backward(xl, sl, local.mean, local.rstd, dy.slice(xo, {2, 4, 3}), o, {6, 2});
  expect_close(gl.dx, gg.dx.slice(xo, {2, 4, 3}), 0, "local dx");
  expect_close(gl.dscale, gg.dscale.slice(po, {4}), 0, "local dscale");
  // Channels [1, 3) split group 0 and group 1: an Error, not a wrong answer.
  std::vector<int64_t> bad{0, 1, 0}, bad_p{1};
  EXPECT_THROW(group_norm(x.slice(bad, {2, 2, 3}), scale.slice(bad_p, {2}), bias.slice(bad_p, {2}), o, {6, 1}),
               Error);
  // An empty channel block holds no group.
  NormOutputs empty = group_norm(Tensor(DType::F64, {2, 0, 3}), Tensor(DType::F64, {0}), Tensor(DType::F64, {0}), o,
                                 {6, 6});
  EXPECT_EQ(empty.mean.shape(), (Shape{2, 0}));
}

TEST(GroupNorm, Errors) {
  Tensor x = random({2, 6, 3}, 80), p = random({6}, 81);
  EXPECT_THROW(group_norm(x, p, p, GroupNormOptions{4, 1e-5, false}), Error);  // 4 does not divide 6
  EXPECT_THROW(group_norm(x, p, p, GroupNormOptions{0, 1e-5, false}), Error);
  EXPECT_THROW(group_norm(x, p, p, GroupNormOptions{3, 1e-5, true}), Error);  // C = 3 in NHWC: scale [6] wrong
  EXPECT_THROW(group_norm_options(Attrs{}), Error);                           // groups is required
  EXPECT_EQ(group_norm_options(Attrs{{"groups", int64_t{3}}}).groups, 3);
  NormOutputs e = group_norm(Tensor(DType::F64, {0, 6, 3}), p, p, GroupNormOptions{3, 1e-5, false});
  EXPECT_EQ(e.mean.shape(), (Shape{0, 3}));
}

// ---- instance_norm

TEST(InstanceNorm, MatchesNaiveAndGroupNormWithOneChannelPerGroup) {
  for (Shape xs : {Shape{2, 3, 4}, Shape{2, 3, 2, 2}, Shape{1, 2, 2, 1, 3}}) {
    int64_t C = xs[1];
    Tensor x = random(xs, 90), scale = random({C}, 91), bias = random({C}, 92);
    NormOutputs r = instance_norm(x, scale, bias, 1e-5);
    auto chan = [](const std::vector<int64_t>& idx) { return idx[1]; };
    auto key = [C](const std::vector<int64_t>& idx) { return idx[0] * C + idx[1]; };
    Naive n = naive_norm(x, scale, bias, xs[0] * C, 1e-5, key, chan);
    expect_close(r.out, n.out, 1e-12, "out");
    ASSERT_EQ(r.mean.shape(), (Shape{xs[0], C}));
    for (int64_t k = 0; k < r.mean.numel(); ++k) {
      EXPECT_NEAR(r.mean.at(k), n.mean[static_cast<size_t>(k)], 1e-12);
      EXPECT_NEAR(r.rstd.at(k), 1 / std::sqrt(n.var[static_cast<size_t>(k)] + 1e-5), 1e-12);
    }
  }
}

TEST(InstanceNorm, HandValues) {
  // One sample, one channel, spatial {0, 2}: mean 1, var 1.
  NormOutputs r = instance_norm(f64({1, 1, 2}, {0, 2}), f64({1}, {3}), f64({1}, {0.5}), 0);
  EXPECT_NEAR(r.out.at(0), -3 + 0.5, 1e-12);
  EXPECT_NEAR(r.out.at(1), 3 + 0.5, 1e-12);
  EXPECT_NEAR(r.mean.at(0), 1, 1e-12);
  EXPECT_NEAR(r.rstd.at(0), 1, 1e-12);
}

TEST(InstanceNorm, GradientsMatchFiniteDifferences) {
  Tensor x = random({2, 3, 4}, 100), scale = random({3}, 101), bias = random({3}, 102), w = random({2, 3, 4}, 103);
  NormOutputs r = instance_norm(x, scale, bias, 1e-5);
  NormGrads g = instance_norm_backward(x, scale, r.mean, r.rstd, w);
  auto out_of = [&](const Tensor& xv, const Tensor& sv, const Tensor& bv) {
    return instance_norm(xv, sv, bv, 1e-5).out;
  };
  expect_close(g.dx, finite_diff(x, w, [&](const Tensor& v) { return out_of(v, scale, bias); }), 1e-6, "dx");
  expect_close(g.dscale, finite_diff(scale, w, [&](const Tensor& v) { return out_of(x, v, bias); }), 1e-6, "dscale");
  expect_close(g.dbias, finite_diff(bias, w, [&](const Tensor& v) { return out_of(x, scale, v); }), 1e-6, "dbias");
}

TEST(InstanceNorm, ErrorsAndEmpty) {
  Tensor p = f64({2}, {1, 1});
  EXPECT_THROW(instance_norm(random({3, 2}, 1), p, p, 1e-5), Error);  // rank 2
  EXPECT_THROW(instance_norm(random({1, 2, 1, 1, 1, 2}, 1), p, p, 1e-5), Error);  // rank 6
  EXPECT_THROW(instance_norm(random({3, 2, 2}, 1), f64({3}, {1, 1, 1}), p, 1e-5), Error);
  NormOutputs e = instance_norm(Tensor(DType::F64, {0, 2, 3}), p, p, 1e-5);
  EXPECT_EQ(e.mean.shape(), (Shape{0, 2}));
  NormOutputs f = instance_norm(random({2, 2, 3}, 5, -2, 2, DType::F32), p.to(DType::F32), p.to(DType::F32), 1e-5);
  EXPECT_EQ(f.out.dtype(), DType::F32);
  NormOutputs ref = instance_norm(random({2, 2, 3}, 5, -2, 2, DType::F32).to(DType::F64), p, p, 1e-5);
  expect_close(f.out, ref.out, 1e-5, "f32 out");
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_channel_norm_rules.cc)
namespace rule_tests {
using namespace spmd;
namespace {

using mesh::parse_dist;

std::string join(const std::vector<DistAttr>& dists) {
  std::string out;
  for (size_t i = 0; i < dists.size(); ++i) out += (i ? " ; " : "") + dists[i].to_string();
  return out;
}

std::vector<TensorSpec> specs(const ProcessMesh& mesh, const std::vector<Shape>& shapes,
                              const std::vector<std::string>& dists) {
  std::vector<TensorSpec> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    // A missing distribution is Replicate.
    DistAttr d = i < dists.size() ? parse_dist(dists[i], mesh.ndim()) : DistAttr(mesh.ndim());
    out.push_back({shapes[i], DType::F64, d});
  }
  return out;
}

// "required inputs | outputs"
std::string fwd(std::string_view rule, const ProcessMesh& mesh, const std::vector<Shape>& shapes,
                const std::vector<std::string>& dists, const Attrs& attrs) {
  auto in = specs(mesh, shapes, dists);
  SpmdResult r = op_registry().rule(rule).forward(mesh, in, attrs);
  return join(r.inputs) + " | " + join(r.outputs);
}

std::string rev(std::string_view rule, const ProcessMesh& mesh, const std::vector<Shape>& in_shapes,
                const std::vector<Shape>& out_shapes, const std::vector<std::string>& want, const Attrs& attrs) {
  auto in = specs(mesh, in_shapes, {});
  auto out = specs(mesh, out_shapes, want);
  SpmdResult r = op_registry().rule(rule).reverse(mesh, in, out, attrs);
  return join(r.inputs) + " | " + join(r.outputs);
}

// "required grad inputs | input grads"
std::string grad(std::string_view rule, const ProcessMesh& mesh, const std::vector<Shape>& shapes,
                 const std::vector<std::string>& dists, const Attrs& attrs) {
  auto in = specs(mesh, shapes, dists);
  SpmdResult r = op_registry().rule(rule).grad(mesh, in, attrs);
  return join(r.inputs) + " | " + join(r.outputs);
}

Attrs bn(bool training, const char* format = "NCHW") {
  return Attrs{{"training", training}, {"data_format", std::string(format)}};
}

std::vector<Shape> bn_shapes(Shape x, int64_t c) { return {x, {c}, {c}, {c}, {c}}; }

TEST(ChannelNormRules, RegisteredWithSummaries) {
  for (const char* name : {"batch_norm", "sync_batch_norm", "group_norm", "instance_norm"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "channel_norm") << name;
      }
    }
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(BatchNormRule, TrainingKeepsChannelAndReplicatesBatch) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_shapes({4, 6}, 6);
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(0),S(1)"}, bn(true)),
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  // Inference: the batch dim stays sharded.
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(0),S(1)"}, bn(false)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  // Training: x's batch sharding is dropped, which frees mesh dim 0 for scale's channel sharding.
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(0),R", "S(0),R"}, bn(true)),
            "S(1),R ; S(0),R ; S(0),R ; S(0),R ; S(0),R | S(1),R ; S(0),R ; S(0),R ; S(0),R ; S(0),R");
  // Partial inputs are resharded to Replicate.
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"P(sum),S(1)", "R,R", "P(avg),R", "R,R", "P(max),R"}, bn(false)),
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
}

TEST(BatchNormRule, ChannelsLastAndSpatialDims) {
  ProcessMesh m(Shape{2, 3});
  // NHWC: C is the last dim; H is spatial.
  auto shapes = bn_shapes({2, 3, 4}, 4);
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(1),S(2)"}, bn(true, "NHWC")),
            "R,S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | R,S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  EXPECT_EQ(fwd("batch_norm", m, shapes, {"S(1),S(2)"}, bn(false, "NHWC")),
            "S(1),S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | S(1),S(2) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  // NCHW: a co-sharded channel keeps its split order.
  auto nchw = bn_shapes({2, 12, 3}, 12);
  EXPECT_EQ(fwd("batch_norm", m, nchw, {"S(1)@1,S(1)@0"}, bn(true)),
            "S(1)@1,S(1)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 | S(1)@1,S(1)@0 ; "
            "S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0");
  EXPECT_THROW(fwd("batch_norm", m, bn_shapes({2, 3, 4}, 3), {}, bn(true, "NHWC")), Error);  // C is 4
}

TEST(BatchNormRule, Reverse) {
  ProcessMesh m(Shape{2});
  auto shapes = bn_shapes({4, 6}, 6);
  // Training: a wanted batch sharding cannot be produced.
  EXPECT_EQ(rev("batch_norm", m, shapes, shapes, {"S(0)", "R", "R", "R", "R"}, bn(true)),
            "R ; R ; R ; R ; R | R ; R ; R ; R ; R");
  EXPECT_EQ(rev("batch_norm", m, shapes, shapes, {"S(0)", "R", "R", "R", "R"}, bn(false)),
            "S(0) ; R ; R ; R ; R | S(0) ; R ; R ; R ; R");
  // A wanted channel sharding of a statistic shards x's C and every parameter.
  EXPECT_EQ(rev("batch_norm", m, shapes, shapes, {"R", "R", "R", "S(0)", "P(sum)"}, bn(true)),
            "S(1) ; S(0) ; S(0) ; S(0) ; S(0) | S(1) ; S(0) ; S(0) ; S(0) ; S(0)");
}

std::vector<Shape> bn_grad_shapes(Shape x, int64_t c) {
  std::vector<Shape> s = bn_shapes(x, c);
  std::vector<Shape> outs = bn_shapes(x, c);
  s.insert(s.end(), outs.begin(), outs.end());
  s.insert(s.end(), outs.begin(), outs.end());
  return s;
}

TEST(BatchNormRule, Grad) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_grad_shapes({4, 6}, 6);
  std::vector<std::string> d(15, "R,R");
  d[0] = "S(0),S(1)";   // x
  d[2] = "P(sum),R";    // bias: not read, laid out like scale
  d[13] = "S(0),R";     // grad of saved_mean: ignored, laid out like saved_mean
  d[10] = "R,P(avg)";   // dout
  // Training: batch -> R; dout's P(avg) loses to the channel sharding on mesh dim 1.
  std::string r = grad("batch_norm", m, shapes, d, bn(true));
  EXPECT_EQ(r,
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; R,S(1) ; R,R ; R,R ; "
            "R,R ; R,R | R,S(1) ; R,S(0) ; R,S(0) ; R,R ; R,R");
  // Inference: x stays batch-sharded, dscale / dbias are P(sum) over it.
  r = grad("batch_norm", m, shapes, d, bn(false));
  EXPECT_EQ(r,
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; S(0),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | S(0),S(1) ; P(sum),S(0) ; P(sum),S(0) ; R,R ; R,R");
  // On a free mesh dim a linear dout Partial passes to every gradient; a Partial x is resharded.
  d[0] = "P(sum),S(1)";
  d[10] = "P(avg),R";
  r = grad("batch_norm", m, shapes, d, bn(true));
  EXPECT_EQ(r,
            "R,S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; P(avg),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | P(avg),S(1) ; P(avg),S(0) ; P(avg),S(0) ; R,R ; R,R");
}

TEST(SyncBatchNormRule, BatchAndSpatialStaySharded) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_shapes({4, 6}, 6);
  // Training keeps the batch sharding (batch_norm would make it R); stats are global: R on it.
  EXPECT_EQ(fwd("sync_batch_norm", m, shapes, {"S(0),S(1)"}, bn(true)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) | S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0)");
  EXPECT_EQ(fwd("sync_batch_norm", m, shapes, {"S(0),S(0)"}, bn(true)),
            "S(0),S(0) ; R,R ; R,R ; R,R ; R,R | S(0),S(0) ; R,R ; R,R ; R,R ; R,R");
  // Partial inputs -> R.
  EXPECT_EQ(fwd("sync_batch_norm", m, shapes, {"P(sum),S(0)", "R,R", "P(avg),R"}, bn(true)),
            "R,S(0) ; R,R ; R,R ; R,R ; R,R | R,S(0) ; R,R ; R,R ; R,R ; R,R");
  // NHWC on [2,3]: batch on mesh dim 0, H on mesh dim 1.
  ProcessMesh m23(Shape{2, 3});
  EXPECT_EQ(fwd("sync_batch_norm", m23, bn_shapes({2, 3, 4}, 4), {"S(0),S(1)"}, bn(true, "NHWC")),
            "S(0),S(1) ; R,R ; R,R ; R,R ; R,R | S(0),S(1) ; R,R ; R,R ; R,R ; R,R");
  // A wanted batch sharding is produced (batch_norm's training reverse cannot).
  ProcessMesh m2(Shape{2});
  EXPECT_EQ(rev("sync_batch_norm", m2, shapes, shapes, {"S(0)", "R", "R", "R", "R"}, bn(true)),
            "S(0) ; R ; R ; R ; R | S(0) ; R ; R ; R ; R");
  EXPECT_THROW(fwd("sync_batch_norm", m, bn_shapes({4, 6, 2, 2, 2, 2}, 6), {}, bn(true)), Error);  // rank 6
}

TEST(SyncBatchNormRule, GradParamsReplicateInTrainingPartialInInference) {
  ProcessMesh m(Shape{2, 2});
  auto shapes = bn_grad_shapes({4, 6}, 6);
  std::vector<std::string> d(15, "R,R");
  d[0] = "S(0),S(1)";
  d[10] = "S(0),S(1)";
  // Training: dscale / dbias all-reduced in the kernel -> R on the batch mesh dim.
  EXPECT_EQ(grad("sync_batch_norm", m, shapes, d, bn(true)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; S(0),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | S(0),S(1) ; R,S(0) ; R,S(0) ; R,R ; R,R");
  // Inference: no reduction in the kernel -> P(sum).
  EXPECT_EQ(grad("sync_batch_norm", m, shapes, d, bn(false)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; R,S(0) ; R,S(0) ; R,R ; R,R ; R,R ; R,S(0) ; R,S(0) ; S(0),S(1) ; "
            "R,R ; R,R ; R,R ; R,R | S(0),S(1) ; P(sum),S(0) ; P(sum),S(0) ; R,R ; R,R");
}

Attrs gn(int64_t groups, const char* format = "NCHW") {
  return Attrs{{"groups", groups}, {"data_format", std::string(format)}};
}

TEST(GroupNormRule, ChannelKeptOnlyOnGroupBoundaries) {
  std::vector<Shape> s = {{2, 6, 3}, {6}, {6}};
  ProcessMesh m2(Shape{2}), m3(Shape{3});
  // Mesh [2] cuts C = 6 into chunks of 3: whole groups for 2 groups (3 channels each), not for 3.
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(1)"}, gn(2)), "S(1) ; S(0) ; S(0) | S(1) ; S(1) ; S(1)");
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(1)"}, gn(3)), "R ; R ; R | R ; R ; R");
  // Mesh [3]: chunks of 2, the reverse.
  EXPECT_EQ(fwd("group_norm", m3, s, {"S(1)"}, gn(3)), "S(1) ; S(0) ; S(0) | S(1) ; S(1) ; S(1)");
  EXPECT_EQ(fwd("group_norm", m3, s, {"R", "S(0)"}, gn(2)), "R ; R ; R | R ; R ; R");
  // The batch dim stays sharded, spatial dims and Partials are resharded.
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(0)"}, gn(3)), "S(0) ; R ; R | S(0) ; S(0) ; S(0)");
  EXPECT_EQ(fwd("group_norm", m2, s, {"S(2)"}, gn(3)), "R ; R ; R | R ; R ; R");
  EXPECT_EQ(fwd("group_norm", m2, s, {"P(sum)", "P(avg)"}, gn(2)), "R ; R ; R | R ; R ; R");
}

TEST(GroupNormRule, NestedChunksAreCheckedLevelByLevel) {
  std::vector<Shape> s = {{2, 12}, {12}, {12}};
  // C = 12, 2 channels per group: [2,3] cuts 6 then 2 (kept); [2,2] cuts 6 then 3 (second dropped).
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2, 3}), s, {"S(1),S(1)"}, gn(6)),
            "S(1),S(1) ; S(0),S(0) ; S(0),S(0) | S(1),S(1) ; S(1),S(1) ; S(1),S(1)");
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2, 2}), s, {"S(1),S(1)"}, gn(6)),
            "S(1),R ; S(0),R ; S(0),R | S(1),R ; S(1),R ; S(1),R");
  // Split order mesh 1 then mesh 0 on [2,3]: 4 then 2, kept with its order.
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2, 3}), s, {"S(1)@1,S(1)@0"}, gn(6)),
            "S(1)@1,S(1)@0 ; S(0)@1,S(0)@0 ; S(0)@1,S(0)@0 | S(1)@1,S(1)@0 ; S(1)@1,S(1)@0 ; S(1)@1,S(1)@0");
  // C = 10, 2 per group on [3,2]: chunks 4, 4, 2; the 2-chunk split in 2 breaks group 4: drop mesh 1.
  std::vector<Shape> s10 = {{2, 10}, {10}, {10}};
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{3, 2}), s10, {"S(1),S(1)"}, gn(5)),
            "S(1),R ; S(0),R ; S(0),R | S(1),R ; S(1),R ; S(1),R");
  // Greedy: a dropped first mesh dim does not stop a later one that aligns on its own.
  // (C = 12 on [4,2]: mesh 0's chunks of 3 split groups, mesh 1's chunks of 6 do not.)
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{4, 2}), s, {"S(1),S(1)"}, gn(6)),
            "R,S(1) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(1) ; R,S(1)");
  // NHWC: C is last.
  std::vector<Shape> nhwc = {{2, 3, 6}, {6}, {6}};
  EXPECT_EQ(fwd("group_norm", ProcessMesh(Shape{2}), nhwc, {"S(2)"}, gn(2, "NHWC")),
            "S(2) ; S(0) ; S(0) | S(2) ; S(1) ; S(1)");
}

TEST(GroupNormRule, ReverseAndGrad) {
  ProcessMesh m(Shape{2, 3});
  std::vector<Shape> in = {{4, 6, 2}, {6}, {6}}, out = {{4, 6, 2}, {4, 3}, {4, 3}};
  // Wanted mean sharded over groups on mesh dim 1 (chunks of 2 channels: whole groups for 3 groups).
  EXPECT_EQ(rev("group_norm", m, in, out, {"S(0),R", "R,S(1)", "R,R"}, gn(3)),
            "S(0),S(1) ; R,S(0) ; R,S(0) | S(0),S(1) ; S(0),S(1) ; S(0),S(1)");
  // With 2 groups (3 channels) mesh dim 1's chunks of 2 split a group: Replicate.
  std::vector<Shape> out2 = {{4, 6, 2}, {4, 2}, {4, 2}};
  EXPECT_EQ(rev("group_norm", m, in, out2, {"R,S(2)", "R,S(1)", "P(sum),R"}, gn(2)),
            "R,R ; R,R ; R,R | R,R ; R,R ; R,R");
  // Grad: dscale / dbias are P(sum) over N's mesh dim and Shard over C's.
  std::vector<Shape> g = {{4, 6, 2}, {6}, {6}, {4, 6, 2}, {4, 3}, {4, 3}, {4, 6, 2}, {4, 3}, {4, 3}};
  std::vector<std::string> d(9, "R,R");
  d[0] = "S(0),S(1)";
  d[2] = "P(max),R";  // bias is not read: laid out like scale
  d[3] = "S(1),R";    // out is not read: kept as given
  d[7] = "P(sum),R";  // the grad of mean is ignored: laid out like mean as given
  EXPECT_EQ(grad("group_norm", m, g, d, gn(3)),
            "S(0),S(1) ; R,S(0) ; R,S(0) ; S(1),R ; S(0),S(1) ; S(0),S(1) ; S(0),S(1) ; R,R ; R,R | S(0),S(1) ; "
            "P(sum),S(0) ; P(sum),S(0)");
  d[0] = "R,S(2)";
  d[6] = "R,P(sum)";  // dout P(sum) on a free mesh dim passes
  EXPECT_EQ(grad("group_norm", m, g, d, gn(3)),
            "R,R ; R,R ; R,R ; S(1),R ; R,R ; R,R ; R,P(sum) ; R,R ; R,R | R,P(sum) ; R,P(sum) ; R,P(sum)");
}

TEST(InstanceNormRule, ForwardReverseGrad) {
  ProcessMesh m(Shape{2, 3});
  std::vector<Shape> s = {{4, 6, 2}, {6}, {6}};
  EXPECT_EQ(fwd("instance_norm", m, s, {"S(0),S(1)"}, {}),
            "S(0),S(1) ; R,S(0) ; R,S(0) | S(0),S(1) ; S(0),S(1) ; S(0),S(1)");
  EXPECT_EQ(fwd("instance_norm", m, s, {"S(2),P(sum)", "R,S(0)"}, {}),
            "R,S(1) ; R,S(0) ; R,S(0) | R,S(1) ; R,S(1) ; R,S(1)");
  std::vector<Shape> out = {{4, 6, 2}, {4, 6}, {4, 6}};
  EXPECT_EQ(rev("instance_norm", m, s, out, {"R,S(2)", "S(1),R", "R,R"}, {}),
            "S(1),R ; S(0),R ; S(0),R | S(1),R ; S(1),R ; S(1),R");
  std::vector<Shape> g = {{4, 6, 2}, {6}, {6}, {4, 6, 2}, {4, 6}, {4, 6}, {4, 6, 2}, {4, 6}, {4, 6}};
  std::vector<std::string> d(9, "R,R");
  d[0] = "S(1),S(0)";
  EXPECT_EQ(grad("instance_norm", m, g, d, {}),
            "S(1),S(0) ; S(0),R ; S(0),R ; R,R ; S(1),S(0) ; S(1),S(0) ; S(1),S(0) ; R,R ; R,R | S(1),S(0) ; "
            "S(0),P(sum) ; S(0),P(sum)");
  EXPECT_THROW(fwd("instance_norm", m, {{4, 6}, {6}, {6}}, {}, {}), Error);  // rank 2
}

}  // namespace
}  // namespace rule_tests

}  // namespace shardwise::ops
