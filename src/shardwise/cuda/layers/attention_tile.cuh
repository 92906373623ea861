#pragma once
// What the fused attention kernels (attention_forward.cu, attention_backward.cu) share: 64 x 64
// tiles of query rows and keys in shared memory as float (rows padded to D + 1 floats against bank
// conflicts), 256 threads a block (two warp groups: the 4 threads of a warp that share a tile row
// split its columns) and the causal and document mask. No
// tensor cores in this first version: every product is a float FMA.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "shardwise/cuda/common/element.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::detail {

inline constexpr int kAttnTile = 64;      // query rows and keys per tile
inline constexpr int kAttnThreads = 256;  // kRowThreads per tile row
inline constexpr int kRowThreads = 4;
inline constexpr int kColsPerThread = kAttnTile / kRowThreads;  // 16 columns of a row's 64
inline constexpr int kScoreLd = kAttnTile + 1;                  // a [64, 64] score tile's row stride

// exp(d) for d = x - max <= 0, 0 below e^-80 as the CPU kernel's exp_of (ops/attention).
__device__ inline float exp_of(float d) { return d < -80.0f ? 0.0f : expf(d); }

// Rows [0, n) of the [*, D] matrix at src into the smem tile dst [64, D + 1] as float times `mul`
// (rows n.. zero).
template <class T>
__device__ void load_tile(const T* src, int D, int n, float mul, float* dst) {
  const int ld = D + 1;
  for (int e = threadIdx.x; e < kAttnTile * D; e += blockDim.x) {
    const int r = e / D, c = e % D;
    dst[r * ld + c] = r < n ? to_f(src[static_cast<long long>(r) * D + c]) * mul : 0.0f;
  }
}

// Rows [0, n) of a per-row vector (lse, delta) into smem (rows n.. zero).
__device__ inline void load_rows(const float* src, int n, float* dst) {
  for (int r = threadIdx.x; r < kAttnTile; r += blockDim.x) dst[r] = r < n ? src[r] : 0.0f;
}

// The dot product of smem rows a and b over D.
__device__ inline float dot_rows(const float* a, const float* b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s = fmaf(a[d], b[d], s);
  return s;
}

// Key j visible to query i (sequence indices): causal, and in the same document when doc_b (the
// batch row's document ids) is given.
__device__ inline bool visible(long long i, long long j, const long long* doc_b) {
  return j <= i && (doc_b == nullptr || doc_b[j] == doc_b[i]);
}

// The shape of one launch; head = (b G + g) R + r indexes q, out, lse and dq; (b G + g) k, v.
struct AttnDims {
  long long B, G, R, S;
  int D;
  float scale;
  long long heads() const { return B * G * R; }
};

inline size_t attn_tile_bytes(int D) { return sizeof(float) * kAttnTile * (D + 1); }
inline size_t attn_score_bytes() { return sizeof(float) * kAttnTile * kScoreLd; }

}  // namespace shardwise::cuda::detail
