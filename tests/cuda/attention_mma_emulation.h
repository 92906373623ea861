#pragma once
// A CPU emulation of the tensor-core attention's arithmetic (cuda/layers/attention_mma_*.cu), to
// check on any machine that its rounding scheme fits the tolerance its GPU test
// (test_cuda_attention_mma.cc) holds it to: the same 64-key tiles and online softmax, P and dS
// rounded to bf16 before they are multiplied (the kernels' wmma operands), f32 products of bf16
// inputs, f32 accumulators, outputs rounded to bf16, the output divided by the sum of the rounded
// P. Summation orders inside a product differ from the tensor cores' (unspecified): this emulates
// the rounding, not the bits. bf16 q [B, G, R, S, D] (or [B, H, S, D]), k, v [B, G, S, D], doc [B, S].
#include <cmath>
#include <vector>

#include "attention_cases.h"
#include "shardwise/core/half.h"

namespace shardwise::cuda_test {

struct EmulatedAttention {
  Tensor out, lse, dq, dk, dv;
};

inline EmulatedAttention emulate_mma_attention(const AttentionInputs& in) {
  const Shape& qs = in.q.shape();
  const int64_t B = qs[0], G = qs[1], R = qs.ndim() == 5 ? qs[2] : 1, S = qs[qs.ndim() - 2], D = qs.back();
  auto floats = [](const Tensor& t) {
    const Tensor f = t.to(DType::F32);
    return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
  };
  const std::vector<float> q = floats(in.q), k = floats(in.k), v = floats(in.v), dout = floats(in.dout);
  const auto scale = static_cast<float>(in.scale);
  auto round = [](float x) { return static_cast<float>(bf16(x)); };
  auto visible = [&](int64_t b, int64_t i, int64_t j) {
    return j <= i && (!in.doc.defined() || in.doc.data<int64_t>()[b * S + j] == in.doc.data<int64_t>()[b * S + i]);
  };
  auto dot = [&](const float* x, const float* y) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; ++d) s += x[d] * y[d];
    return s;
  };
  const int64_t heads = B * G * R;
  std::vector<float> out(q.size()), lse(static_cast<size_t>(heads * S)), dq(q.size(), 0.0f), dk(k.size(), 0.0f),
      dv(v.size(), 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t b = h / (G * R), kv = h / R;
    for (int64_t i = 0; i < S; ++i) {  // the forward, one row: key tiles of 64, online softmax
      const float* qi = &q[static_cast<size_t>((h * S + i) * D)];
      std::vector<float> o(static_cast<size_t>(D), 0.0f);
      float m = -INFINITY, l = 0.0f, lh = 0.0f;
      for (int64_t j0 = 0; j0 <= i; j0 += 64) {
        float mx = -INFINITY;
        std::vector<float> s(64, -INFINITY);
        for (int64_t j = j0; j < std::min(j0 + 64, S); ++j) {
          if (visible(b, i, j)) s[static_cast<size_t>(j - j0)] = dot(qi, &k[static_cast<size_t>((kv * S + j) * D)]) * scale;
          mx = std::max(mx, s[static_cast<size_t>(j - j0)]);
        }
        const float mnew = std::max(m, mx);
        if (mnew == -INFINITY) continue;
        const float alpha = m - mnew < -80.0f ? 0.0f : std::exp(m - mnew);
        float sum = 0.0f, sumh = 0.0f;
        for (float& x : o) x *= alpha;
        for (int64_t j = j0; j < std::min(j0 + 64, S); ++j) {
          const float d = s[static_cast<size_t>(j - j0)] - mnew;
          const float p = d < -80.0f ? 0.0f : std::exp(d), ph = round(p);
          sum += p, sumh += ph;
          for (int64_t e = 0; e < D; ++e) o[static_cast<size_t>(e)] += ph * v[static_cast<size_t>((kv * S + j) * D + e)];
        }
        m = mnew, l = l * alpha + sum, lh = lh * alpha + sumh;
      }
      for (int64_t e = 0; e < D; ++e) out[static_cast<size_t>((h * S + i) * D + e)] = round(o[static_cast<size_t>(e)] / lh);
      lse[static_cast<size_t>(h * S + i)] = static_cast<float>(m + std::log(static_cast<double>(l)));
    }
  }
  for (int64_t h = 0; h < heads; ++h) {  // the backward: p from lse, dS rounded to bf16
    const int64_t b = h / (G * R), kv = h / R;
    for (int64_t i = 0; i < S; ++i) {
      const float* oi = &out[static_cast<size_t>((h * S + i) * D)];
      const float* gi = &dout[static_cast<size_t>((h * S + i) * D)];
      double delta = 0.0;
      for (int64_t e = 0; e < D; ++e) delta += static_cast<double>(gi[e]) * oi[e];
      for (int64_t j = 0; j <= i; ++j) {
        if (!visible(b, i, j)) continue;
        const size_t kj = static_cast<size_t>((kv * S + j) * D), qi = static_cast<size_t>((h * S + i) * D);
        const float p = std::exp(dot(&q[qi], &k[kj]) * scale - lse[static_cast<size_t>(h * S + i)]);
        const float ds = round(p * (dot(gi, &v[kj]) - static_cast<float>(delta))), ph = round(p);
        for (int64_t e = 0; e < D; ++e) {
          dv[kj + static_cast<size_t>(e)] += ph * gi[e];
          dk[kj + static_cast<size_t>(e)] += ds * q[qi + static_cast<size_t>(e)];
          dq[qi + static_cast<size_t>(e)] += ds * k[kj + static_cast<size_t>(e)];
        }
      }
    }
  }
  auto bf16_tensor = [&](std::vector<float> x, const Shape& s, float mul) {
    for (float& e : x) e *= mul;
    return Tensor::from<float>(s, x).to(DType::BF16);
  };
  Shape lse_shape(qs.span().first(qs.size() - 1));
  return {Tensor::from<float>(qs, out).to(DType::BF16), Tensor::from<float>(lse_shape, lse),
          bf16_tensor(dq, qs, scale), bf16_tensor(dk, in.k.shape(), scale), bf16_tensor(dv, in.v.shape(), 1.0f)};
}

}  // namespace shardwise::cuda_test
