// The fused causal attention's forward (FlashAttention-2): one block per (query head, 64 query
// rows); the keys stream through shared memory 64 at a time, past the last visible tile never;
// an online softmax (running max m, running sum l, the accumulator rescaled by exp(m_old - m_new))
// as the CPU kernel (ops/attention/kernels.cc) computes it, and lse = m + log(l). Each thread owns
// one tile row's every 4th column and every 4th output dim: no atomics, the same bits every run.
#include "shardwise/cuda/layers/attention_mma.cuh"
#include "shardwise/cuda/layers/attention_tile.cuh"

#include <cfloat>
#include <cmath>

namespace shardwise::cuda::launch {

namespace {

using namespace detail;  // attention_tile.cuh

template <class T, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    attn_forward(const T* q, const T* k, const T* v, const long long* doc, T* out, float* lse, AttnDims a) {
  extern __shared__ float smem[];
  const int D = a.D, ld = D + 1;
  float *Qs = smem, *Ks = Qs + kAttnTile * ld, *Vs = Ks + kAttnTile * ld, *P = Vs + kAttnTile * ld;
  const long long head = blockIdx.x, S = a.S, b = head / (a.G * a.R), kv = head / a.R;
  const long long i0 = static_cast<long long>(blockIdx.y) * kAttnTile;
  const int ni = static_cast<int>(min(static_cast<long long>(kAttnTile), S - i0));
  const int row = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
  const long long i = i0 + row;
  const long long* doc_b = doc == nullptr ? nullptr : doc + b * S;
  load_tile(q + (head * S + i0) * D, D, ni, a.scale, Qs);
  float acc[kMaxD / kRowThreads];
  for (float& x : acc) x = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (long long j0 = 0; j0 < i0 + ni; j0 += kAttnTile) {  // causal: no key past the last row
    const int nj = static_cast<int>(min(static_cast<long long>(kAttnTile), S - j0));
    __syncthreads();  // the previous tile's K, V and P are read
    load_tile(k + (kv * S + j0) * D, D, nj, 1.0f, Ks);
    load_tile(v + (kv * S + j0) * D, D, nj, 1.0f, Vs);
    __syncthreads();
    float s[kColsPerThread], mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < kColsPerThread; ++t) {
      const int c = part + kRowThreads * t;
      const bool on = row < ni && c < nj && visible(i, j0 + c, doc_b);
      s[t] = on ? dot_rows(Qs + row * ld, Ks + c * ld, D) : -INFINITY;
      mx = fmaxf(mx, s[t]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m, mx);
    const bool none = mnew == -INFINITY;  // nothing visible to this row yet (a later document)
    const float alpha = none ? 1.0f : exp_of(m - mnew);
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kColsPerThread; ++t) {
      const float p = none ? 0.0f : exp_of(s[t] - mnew);
      P[row * kScoreLd + part + kRowThreads * t] = p;
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!none) m = mnew;
    l = l * alpha + sum;
    __syncwarp();  // the row's 4 threads (one warp) wrote P's row
#pragma unroll
    for (int t = 0; t < kMaxD / kRowThreads; ++t) acc[t] *= alpha;
    for (int c = 0; c < nj; ++c) {
      const float p = P[row * kScoreLd + c];
      const float* vrow = Vs + c * ld;
#pragma unroll
      for (int t = 0; t < kMaxD / kRowThreads; ++t) {
        const int d = part + kRowThreads * t;
        if (d < D) acc[t] = fmaf(p, vrow[d], acc[t]);
      }
    }
  }
  if (row >= ni) return;
  const float inv = l > 0.0f ? static_cast<float>(1.0 / static_cast<double>(l)) : 0.0f;
  T* o = out + (head * S + i) * D;
#pragma unroll
  for (int t = 0; t < kMaxD / kRowThreads; ++t) {
    const int d = part + kRowThreads * t;
    if (d < D) o[d] = from_f<T>(acc[t] * inv);
  }
  if (part == 0) {
    lse[head * S + i] = l > 0.0f ? static_cast<float>(static_cast<double>(m) + log(static_cast<double>(l))) : -INFINITY;
  }
}

template <class T, int kMaxD>
int launch_forward(const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                   const AttnDims& a, cudaStream_t stream) {
  const size_t bytes = 3 * attn_tile_bytes(a.D) + attn_score_bytes();
  auto kernel = attn_forward<T, kMaxD>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.heads()), static_cast<unsigned>((a.S + kAttnTile - 1) / kAttnTile));
  kernel<<<grid, kAttnThreads, bytes, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                 static_cast<const T*>(v), reinterpret_cast<const long long*>(doc),
                                                 static_cast<T*>(out), lse, a);
  return cudaGetLastError();
}

template <class T>
int forward_for(const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                const AttnDims& a, cudaStream_t s) {
  if (a.D <= 32) return launch_forward<T, 32>(q, k, v, doc, out, lse, a, s);
  if (a.D <= 64) return launch_forward<T, 64>(q, k, v, doc, out, lse, a, s);
  return launch_forward<T, 128>(q, k, v, doc, out, lse, a, s);
}

}  // namespace

int attention_forward(Elem e, const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                      const AttentionShape& shape, void* s) {
  const AttnDims a{shape.batch, shape.groups, shape.reps, shape.seq, static_cast<int>(shape.head_dim), shape.scale};
  if (a.heads() == 0 || a.S == 0 || a.D == 0) return cudaSuccess;
  if (a.D > 128) return cudaErrorInvalidValue;
  auto stream = static_cast<cudaStream_t>(s);
  const bool mma = mma_plan::use_tensor_cores(e == Elem::BF16, a.D, {q, k, v, out});
  if (shape.path == AttentionPath::TensorCore && !mma) return cudaErrorInvalidValue;
  if (mma && shape.path != AttentionPath::Fma) return attention_forward_mma(q, k, v, doc, out, lse, a, stream);
  return e == Elem::F32 ? forward_for<float>(q, k, v, doc, out, lse, a, stream)
                        : forward_for<__nv_bfloat16>(q, k, v, doc, out, lse, a, stream);
}

}  // namespace shardwise::cuda::launch
