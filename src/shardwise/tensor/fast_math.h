#pragma once
// Branch-free float exp and tanh that the compiler vectorizes (glibc's expf/tanhf are scalar
// calls). exp: Cody-Waite range reduction by ln 2 and a degree-6 Taylor polynomial on
// |r| <= ln2 / 2 (truncation error < 2e-7 relative, about 2 ulp); tanh(u) = sign(u) (1 - e) / (1 + e)
// with e = exp(-2 |u|): absolute error below 3e-7, which is what GELU needs (it adds tanh to 1).
#include <bit>
#include <cstdint>

// SW_SIMD_CLONES before a (non-template) kernel function: GCC compiles it for AVX-512, AVX2 and
// baseline x86-64 and picks the widest the CPU has when the program loads. With -ffp-contract=off
// (CMakeLists.txt) and no fast-math every clone performs the same IEEE operations in the same order,
// so all give the same bits; only the vector width differs. Off under sanitizers and other compilers.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__)
#define SW_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SW_SIMD_CLONES
#endif

namespace shardwise {

inline float fast_expf(float x) {
  x = x > -87.0f ? x : -87.0f;  // also maps NaN to -87: callers that must propagate NaN do so themselves
  x = x < 88.0f ? x : 88.0f;
  // Round x / ln 2 to the nearest integer by adding and removing 1.5 * 2^23 (exact for |v| < 2^22):
  // plain float arithmetic, so it vectorizes without SSE4.1's round instruction.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;  // ln 2 = hi + lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return p * std::bit_cast<float>(bits);
}

inline float fast_tanhf(float u) {
  const float a = u < 0 ? -u : u;
  const float e = fast_expf(-2.0f * a);
  const float t = (1.0f - e) / (1.0f + e);
  return u < 0 ? -t : t;
}

}  // namespace shardwise
