// The fused causal attention's backward, recomputing the probabilities from the log-sum-exp
// (p = exp(q k * scale - lse), dS = p (dO v - delta), delta_i = sum_d dO[i, d] O[i, d]) in three
// passes and no atomics, so every run gives the same bits:
//   delta: one warp per row, in double as the CPU kernel (ops/attention/kernels.cc);
//   dk, dv: one block per (kv head, 64 keys), over its group's R query heads and every query tile
//           at or after its keys (causal), dv += p^T dO and dk += dS^T (q scale) in registers;
//   dq:     one block per (query head, 64 rows), over the key tiles at or before its rows,
//           dq += dS k, times scale at the end.
#include "shardwise/cuda/layers/attention_mma.cuh"
#include "shardwise/cuda/layers/attention_tile.cuh"

#include "shardwise/cuda/common/block_reduce.cuh"

namespace shardwise::cuda::launch {

namespace {

using namespace detail;  // attention_tile.cuh

template <class T>
__global__ void attn_delta(const T* out, const T* dout, float* delta, long long rows, int D) {
  const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / 32;
  for (long long r = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    double acc = 0.0;  // a whole warp takes each row
    for (int d = threadIdx.x % 32; d < D; d += 32) {
      acc += static_cast<double>(to_f(dout[r * D + d])) * static_cast<double>(to_f(out[r * D + d]));
    }
    acc = warp_sum(acc);
    if (threadIdx.x % 32 == 0) delta[r] = static_cast<float>(acc);
  }
}

// p and dS of query row i (tile row a) and key j (tile row c), or 0 and 0 where j is invisible.
struct ProbGrad {
  float p, ds;
};
__device__ inline ProbGrad prob_grad(const float* Qs, const float* dOs, const float* Ks, const float* Vs,
                                     const float* lse, const float* delta, int a, int c, int ld, int D) {
  const float p = exp_of(dot_rows(Qs + a * ld, Ks + c * ld, D) - lse[a]);
  const float dp = dot_rows(dOs + a * ld, Vs + c * ld, D);
  return {p, p * (dp - delta[a])};
}

template <class T, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    attn_dkdv(const T* q, const T* k, const T* v, const long long* doc, const float* lse, const float* delta,
              const T* dout, T* dk, T* dv, AttnDims a) {
  extern __shared__ float smem[];
  const int D = a.D, ld = D + 1;
  float *Ks = smem, *Vs = Ks + kAttnTile * ld, *Qs = Vs + kAttnTile * ld, *dOs = Qs + kAttnTile * ld;
  float *P = dOs + kAttnTile * ld, *dS = P + kAttnTile * kScoreLd, *L = dS + kAttnTile * kScoreLd, *Dl = L + kAttnTile;
  const long long kv = blockIdx.x, S = a.S, b = kv / a.G;
  const long long j0 = static_cast<long long>(blockIdx.y) * kAttnTile;
  const int nj = static_cast<int>(min(static_cast<long long>(kAttnTile), S - j0));
  const int key = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
  const long long* doc_b = doc == nullptr ? nullptr : doc + b * S;
  load_tile(k + (kv * S + j0) * D, D, nj, 1.0f, Ks);
  load_tile(v + (kv * S + j0) * D, D, nj, 1.0f, Vs);
  float gk[kMaxD / kRowThreads], gv[kMaxD / kRowThreads];
  for (int t = 0; t < kMaxD / kRowThreads; ++t) gk[t] = gv[t] = 0.0f;
  for (long long r = 0; r < a.R; ++r) {
    const long long head = kv * a.R + r;
    for (long long i0 = j0; i0 < S; i0 += kAttnTile) {  // causal: rows at or after the keys
      const int ni = static_cast<int>(min(static_cast<long long>(kAttnTile), S - i0));
      __syncthreads();  // the previous tile's Q, dO, P, dS are read
      load_tile(q + (head * S + i0) * D, D, ni, a.scale, Qs);
      load_tile(dout + (head * S + i0) * D, D, ni, 1.0f, dOs);
      load_rows(lse + head * S + i0, ni, L);
      load_rows(delta + head * S + i0, ni, Dl);
      __syncthreads();
#pragma unroll 4
      for (int t = 0; t < kColsPerThread; ++t) {  // this thread's rows of the key's column
        const int row = part + kRowThreads * t;
        ProbGrad g{0.0f, 0.0f};
        if (row < ni && key < nj && visible(i0 + row, j0 + key, doc_b)) g = prob_grad(Qs, dOs, Ks, Vs, L, Dl, row, key, ld, D);
        P[row * kScoreLd + key] = g.p;
        dS[row * kScoreLd + key] = g.ds;
      }
      __syncwarp();  // the key's 4 threads (one warp) wrote its column
      for (int row = 0; row < ni; ++row) {
        const float p = P[row * kScoreLd + key], ds = dS[row * kScoreLd + key];
#pragma unroll
        for (int t = 0; t < kMaxD / kRowThreads; ++t) {
          const int d = part + kRowThreads * t;
          if (d < D) {
            gv[t] = fmaf(p, dOs[row * ld + d], gv[t]);
            gk[t] = fmaf(ds, Qs[row * ld + d], gk[t]);
          }
        }
      }
    }
  }
  if (key >= nj) return;
  const long long at = (kv * S + j0 + key) * D;
#pragma unroll
  for (int t = 0; t < kMaxD / kRowThreads; ++t) {
    const int d = part + kRowThreads * t;
    if (d < D) dk[at + d] = from_f<T>(gk[t]), dv[at + d] = from_f<T>(gv[t]);
  }
}

template <class T, int kMaxD>
__global__ void __launch_bounds__(kAttnThreads)
    attn_dq(const T* q, const T* k, const T* v, const long long* doc, const float* lse, const float* delta,
            const T* dout, T* dq, AttnDims a) {
  extern __shared__ float smem[];
  const int D = a.D, ld = D + 1;
  float *Qs = smem, *dOs = Qs + kAttnTile * ld, *Ks = dOs + kAttnTile * ld, *Vs = Ks + kAttnTile * ld;
  float *dS = Vs + kAttnTile * ld, *L = dS + kAttnTile * kScoreLd, *Dl = L + kAttnTile;
  const long long head = blockIdx.x, S = a.S, b = head / (a.G * a.R), kv = head / a.R;
  const long long i0 = static_cast<long long>(blockIdx.y) * kAttnTile;
  const int ni = static_cast<int>(min(static_cast<long long>(kAttnTile), S - i0));
  const int row = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
  const long long* doc_b = doc == nullptr ? nullptr : doc + b * S;
  load_tile(q + (head * S + i0) * D, D, ni, a.scale, Qs);
  load_tile(dout + (head * S + i0) * D, D, ni, 1.0f, dOs);
  load_rows(lse + head * S + i0, ni, L);
  load_rows(delta + head * S + i0, ni, Dl);
  float gq[kMaxD / kRowThreads];
  for (float& x : gq) x = 0.0f;
  for (long long j0 = 0; j0 < i0 + ni; j0 += kAttnTile) {  // causal: keys at or before the rows
    const int nj = static_cast<int>(min(static_cast<long long>(kAttnTile), S - j0));
    __syncthreads();  // the previous tile's K, V are read (and Q, dO loaded, the first time)
    load_tile(k + (kv * S + j0) * D, D, nj, 1.0f, Ks);
    load_tile(v + (kv * S + j0) * D, D, nj, 1.0f, Vs);
    __syncthreads();
#pragma unroll 4
    for (int t = 0; t < kColsPerThread; ++t) {
      const int c = part + kRowThreads * t;
      float ds = 0.0f;
      if (row < ni && c < nj && visible(i0 + row, j0 + c, doc_b)) ds = prob_grad(Qs, dOs, Ks, Vs, L, Dl, row, c, ld, D).ds;
      dS[row * kScoreLd + c] = ds;
    }
    __syncwarp();  // the row's 4 threads (one warp) wrote its dS row
    for (int c = 0; c < nj; ++c) {
      const float ds = dS[row * kScoreLd + c];
#pragma unroll
      for (int t = 0; t < kMaxD / kRowThreads; ++t) {
        const int d = part + kRowThreads * t;
        if (d < D) gq[t] = fmaf(ds, Ks[c * ld + d], gq[t]);
      }
    }
  }
  if (row >= ni) return;
  T* o = dq + (head * S + i0 + row) * D;
#pragma unroll
  for (int t = 0; t < kMaxD / kRowThreads; ++t) {
    const int d = part + kRowThreads * t;
    if (d < D) o[d] = from_f<T>(gq[t] * a.scale);
  }
}

struct BackwardPtrs {
  const void *q, *k, *v, *out, *dout;
  const long long* doc;
  const float* lse;
  float* delta;
  void *dq, *dk, *dv;
};

template <class T, int kMaxD>
int launch_backward(const BackwardPtrs& p, const AttnDims& a, bool mma, cudaStream_t stream) {
  auto c = [](const void* x) { return static_cast<const T*>(x); };
  const long long rows = a.heads() * a.S;
  attn_delta<T><<<grid_for(rows * 32), kBlock, 0, stream>>>(c(p.out), c(p.dout), p.delta, rows, a.D);
  if (mma) return attention_backward_mma(p.q, p.k, p.v, p.doc, p.lse, p.delta, p.dout, p.dq, p.dk, p.dv, a, stream);
  const unsigned tiles = static_cast<unsigned>((a.S + kAttnTile - 1) / kAttnTile);
  const size_t kv_bytes = 4 * attn_tile_bytes(a.D) + 2 * attn_score_bytes() + 2 * kAttnTile * sizeof(float);
  const size_t q_bytes = 4 * attn_tile_bytes(a.D) + attn_score_bytes() + 2 * kAttnTile * sizeof(float);
  cudaError_t e = cudaFuncSetAttribute(attn_dkdv<T, kMaxD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kv_bytes));
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(attn_dq<T, kMaxD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(q_bytes));
  }
  if (e != cudaSuccess) return e;
  attn_dkdv<T, kMaxD><<<dim3(static_cast<unsigned>(a.B * a.G), tiles), kAttnThreads, kv_bytes, stream>>>(
      c(p.q), c(p.k), c(p.v), p.doc, p.lse, p.delta, c(p.dout), static_cast<T*>(p.dk), static_cast<T*>(p.dv), a);
  attn_dq<T, kMaxD><<<dim3(static_cast<unsigned>(a.heads()), tiles), kAttnThreads, q_bytes, stream>>>(
      c(p.q), c(p.k), c(p.v), p.doc, p.lse, p.delta, c(p.dout), static_cast<T*>(p.dq), a);
  return cudaGetLastError();
}

template <class T>
int backward_for(const BackwardPtrs& p, const AttnDims& a, bool mma, cudaStream_t s) {
  if (a.D <= 32) return launch_backward<T, 32>(p, a, false, s);
  if (a.D <= 64) return launch_backward<T, 64>(p, a, mma, s);
  return launch_backward<T, 128>(p, a, mma, s);
}

}  // namespace

int attention_backward(Elem e, const void* q, const void* k, const void* v, const int64_t* doc, const void* out,
                       const float* lse, const void* dout, float* delta, void* dq, void* dk, void* dv,
                       const AttentionShape& shape, void* s) {
  const AttnDims a{shape.batch, shape.groups, shape.reps, shape.seq, static_cast<int>(shape.head_dim), shape.scale};
  if (a.heads() == 0 || a.S == 0 || a.D == 0) return cudaSuccess;
  if (a.D > 128) return cudaErrorInvalidValue;
  const BackwardPtrs p{q, k, v, out, dout, reinterpret_cast<const long long*>(doc), lse, delta, dq, dk, dv};
  auto stream = static_cast<cudaStream_t>(s);
  const bool mma = mma_plan::use_tensor_cores(e == Elem::BF16, a.D, {q, k, v, dout, dq, dk, dv});
  if (shape.path == AttentionPath::TensorCore && !mma) return cudaErrorInvalidValue;
  const bool use = mma && shape.path != AttentionPath::Fma;  // f32 never takes it: backward_for<float> is told no
  return e == Elem::F32 ? backward_for<float>(p, a, false, stream) : backward_for<__nv_bfloat16>(p, a, use, stream);
}

}  // namespace shardwise::cuda::launch
