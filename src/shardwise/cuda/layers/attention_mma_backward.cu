// The tensor-core backward of the fused causal attention, bf16 with head dim 64 or 128, recomputing
// p = exp(s - lse) from the forward's log-sum-exp (s = q k scale), dS = p (dP - delta) with
// dP = dO v^T and delta the FMA path's (attention_backward.cu), in two passes with no atomics:
//   dk, dv: one block of 4 warps per (kv head, 64 keys), over its group's R query heads and every
//           query tile at or after its keys (causal); per query tile warp w computes S and dP for
//           query rows [16 w, +16), its lanes P and dS (bf16) for those rows, then, after a block
//           barrier, dV += P^T dO and dK += dS^T Q for key rows [16 w, +16) (f32 in shared memory);
//           dk = dK scale.
//   dq:     one block per (query head, 64 rows), over the key tiles at or before its rows; warp w
//           computes S, dP, dS and dQ += dS K for its own 16 rows; dq = dQ scale.
// Every value has one owner and a fixed order of sums: the same bits every run.
#include "shardwise/cuda/layers/attention_mma.cuh"

namespace shardwise::cuda::launch {

namespace {

using namespace detail;  // attention_tile.cuh, attention_mma.cuh

struct MmaGradPtrs {
  const bf16 *q, *k, *v, *dout;
  const long long* doc;
  const float *lse, *delta;
  bf16 *dq, *dk, *dv;
};

// Rows [0, n) of a per-row f32 vector (lse, delta) into smem; rows n.. zero. All threads.
__device__ inline void load_vec(const float* src, int n, float* dst) {
  for (int r = threadIdx.x; r < mp::kTile; r += blockDim.x) dst[r] = r < n ? src[r] : 0.0f;
}

// One warp, its 16 query rows of the tiles at (i0, j0): S = Q K^T and dP = dO V^T on the fragments,
// then per lane (two a row) p = exp(s scale - lse) and dS = p (dP - delta) where key j0 + c is
// visible to query i0 + r (0 elsewhere); P (when P is given) and dS written as bf16.
template <int D>
__device__ void warp_probs_grads(const mp::BackwardSmem& L, unsigned char* smem, long long i0, int ni, long long j0,
                                 int nj, const long long* doc_b, float scale, bool write_p) {
  constexpr int ldh = mp::ld_bf16(D), lds = mp::ld_f32(mp::kTile), ldp = mp::ld_bf16(mp::kTile);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * mp::kWarpRows;
  const bf16 *Qs = reinterpret_cast<const bf16*>(smem + L.q), *dOs = reinterpret_cast<const bf16*>(smem + L.dout);
  const bf16 *Ks = reinterpret_cast<const bf16*>(smem + L.k), *Vs = reinterpret_cast<const bf16*>(smem + L.v);
  float *Ss = reinterpret_cast<float*>(smem + L.s), *dPs = reinterpret_cast<float*>(smem + L.dp);
  const float *lse = reinterpret_cast<const float*>(smem + L.lse), *delta = reinterpret_cast<const float*>(smem + L.delta);
  bf16 *Ps = reinterpret_cast<bf16*>(smem + L.p), *dSs = reinterpret_cast<bf16*>(smem + L.ds);
  warp_abt<D>(Qs + mp::frag_at(ldh, w0, 0), ldh, Ks, ldh, Ss + mp::frag_at(lds, w0, 0), lds);
  warp_abt<D>(dOs + mp::frag_at(ldh, w0, 0), ldh, Vs, ldh, dPs + mp::frag_at(lds, w0, 0), lds);
  __syncwarp();
  const int row = w0 + mp::lane_row(lane), c0 = mp::lane_col0(lane, mp::kTile);
  const long long i = i0 + row;
  for (int c = c0; c < c0 + mp::kTile / 2; ++c) {
    const bool on = row < ni && c < nj && visible(i, j0 + c, doc_b);
    const float p = on ? exp_of(Ss[mp::frag_at(lds, row, c)] * scale - lse[row]) : 0.0f;
    const float ds = p * (dPs[mp::frag_at(lds, row, c)] - delta[row]);
    if (write_p) Ps[mp::frag_at(ldp, row, c)] = __float2bfloat16_rn(p);
    dSs[mp::frag_at(ldp, row, c)] = __float2bfloat16_rn(ds);
  }
}

template <int D>
__global__ void __launch_bounds__(mp::kThreads) attn_dkdv_mma(MmaGradPtrs g, AttnDims a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr mp::BackwardSmem L = mp::backward_smem(D, true);
  constexpr int ldh = mp::ld_bf16(D), ldp = mp::ld_bf16(mp::kTile), lda = mp::ld_f32(D);
  const long long kvh = blockIdx.x, S = a.S, b = kvh / a.G;
  const long long j0 = static_cast<long long>(blockIdx.y) * mp::kTile;
  const int nj = mp::tile_rows(j0, S), w0 = (threadIdx.x / 32) * mp::kWarpRows;
  const long long* doc_b = g.doc == nullptr ? nullptr : g.doc + b * S;
  float *dK = reinterpret_cast<float*>(smem + L.acc0), *dV = reinterpret_cast<float*>(smem + L.acc1);
  load_bf16_rows<D>(g.k + (kvh * S + j0) * D, nj, reinterpret_cast<bf16*>(smem + L.k));
  load_bf16_rows<D>(g.v + (kvh * S + j0) * D, nj, reinterpret_cast<bf16*>(smem + L.v));
  zero_f32_tile(dK, D);
  zero_f32_tile(dV, D);
  for (long long r = 0; r < a.R; ++r) {
    const long long head = kvh * a.R + r;
    for (long long i0 = mp::first_query_tile(j0); i0 < S; i0 += mp::kTile) {
      const int ni = mp::tile_rows(i0, S);
      __syncthreads();  // every warp is done with the previous Q, dO, P and dS
      load_bf16_rows<D>(g.q + (head * S + i0) * D, ni, reinterpret_cast<bf16*>(smem + L.q));
      load_bf16_rows<D>(g.dout + (head * S + i0) * D, ni, reinterpret_cast<bf16*>(smem + L.dout));
      load_vec(g.lse + head * S + i0, ni, reinterpret_cast<float*>(smem + L.lse));
      load_vec(g.delta + head * S + i0, ni, reinterpret_cast<float*>(smem + L.delta));
      __syncthreads();
      warp_probs_grads<D>(L, smem, i0, ni, j0, nj, doc_b, a.scale, true);
      __syncthreads();  // P and dS of every query row: the key rows' products read them all
      const bf16 *Ps = reinterpret_cast<const bf16*>(smem + L.p), *dSs = reinterpret_cast<const bf16*>(smem + L.ds);
      warp_acc_ab<wm::col_major, D>(Ps + w0, ldp, reinterpret_cast<const bf16*>(smem + L.dout), ldh,
                                    dV + mp::frag_at(lda, w0, 0), lda);
      warp_acc_ab<wm::col_major, D>(dSs + w0, ldp, reinterpret_cast<const bf16*>(smem + L.q), ldh,
                                    dK + mp::frag_at(lda, w0, 0), lda);
    }
  }
  __syncwarp();  // the warp's last dK, dV rows are stored (every warp writes only its own rows)
  store_rows_bf16<D>(dK, nj, a.scale, g.dk + (kvh * S + j0) * D);
  store_rows_bf16<D>(dV, nj, 1.0f, g.dv + (kvh * S + j0) * D);
}

template <int D>
__global__ void __launch_bounds__(mp::kThreads) attn_dq_mma(MmaGradPtrs g, AttnDims a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr mp::BackwardSmem L = mp::backward_smem(D, false);
  constexpr int ldh = mp::ld_bf16(D), ldp = mp::ld_bf16(mp::kTile), lda = mp::ld_f32(D);
  const long long head = blockIdx.x, S = a.S, b = head / (a.G * a.R), kv = head / a.R;
  const long long i0 = static_cast<long long>(blockIdx.y) * mp::kTile;
  const int ni = mp::tile_rows(i0, S), w0 = (threadIdx.x / 32) * mp::kWarpRows;
  const long long* doc_b = g.doc == nullptr ? nullptr : g.doc + b * S;
  float* dQ = reinterpret_cast<float*>(smem + L.acc0);
  load_bf16_rows<D>(g.q + (head * S + i0) * D, ni, reinterpret_cast<bf16*>(smem + L.q));
  load_bf16_rows<D>(g.dout + (head * S + i0) * D, ni, reinterpret_cast<bf16*>(smem + L.dout));
  load_vec(g.lse + head * S + i0, ni, reinterpret_cast<float*>(smem + L.lse));
  load_vec(g.delta + head * S + i0, ni, reinterpret_cast<float*>(smem + L.delta));
  zero_f32_tile(dQ, D);
  for (long long j0 = 0; j0 < mp::key_end(i0, ni); j0 += mp::kTile) {
    const int nj = mp::tile_rows(j0, S);
    __syncthreads();  // every warp is done with the previous K and V
    load_bf16_rows<D>(g.k + (kv * S + j0) * D, nj, reinterpret_cast<bf16*>(smem + L.k));
    load_bf16_rows<D>(g.v + (kv * S + j0) * D, nj, reinterpret_cast<bf16*>(smem + L.v));
    __syncthreads();
    warp_probs_grads<D>(L, smem, i0, ni, j0, nj, doc_b, a.scale, false);
    __syncwarp();  // the warp's dS rows are written; dQ's rows are the warp's own
    warp_acc_ab<wm::row_major, D>(reinterpret_cast<const bf16*>(smem + L.ds) + mp::frag_at(ldp, w0, 0), ldp,
                                  reinterpret_cast<const bf16*>(smem + L.k), ldh, dQ + mp::frag_at(lda, w0, 0), lda);
  }
  __syncwarp();
  store_rows_bf16<D>(dQ, ni, a.scale, g.dq + (head * S + i0) * D);
}

template <int D>
int launch_backward_mma(const MmaGradPtrs& p, const AttnDims& a, cudaStream_t stream) {
  constexpr size_t kv_bytes = mp::backward_smem(D, true).total, q_bytes = mp::backward_smem(D, false).total;
  static_assert(kv_bytes <= mp::kMaxSmem && q_bytes <= mp::kMaxSmem, "the backward's shared memory exceeds sm_90's");
  cudaError_t e = cudaFuncSetAttribute(attn_dkdv_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kv_bytes));
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(attn_dq_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(q_bytes));
  }
  if (e != cudaSuccess) return e;
  const unsigned tiles = static_cast<unsigned>((a.S + mp::kTile - 1) / mp::kTile);
  attn_dkdv_mma<D><<<dim3(static_cast<unsigned>(a.B * a.G), tiles), mp::kThreads, kv_bytes, stream>>>(p, a);
  attn_dq_mma<D><<<dim3(static_cast<unsigned>(a.heads()), tiles), mp::kThreads, q_bytes, stream>>>(p, a);
  return cudaGetLastError();
}

}  // namespace

int attention_backward_mma(const void* q, const void* k, const void* v, const long long* doc, const float* lse,
                           const float* delta, const void* dout, void* dq, void* dk, void* dv,
                           const detail::AttnDims& a, cudaStream_t s) {
  auto c = [](const void* x) { return static_cast<const bf16*>(x); };
  auto m = [](void* x) { return static_cast<bf16*>(x); };
  const MmaGradPtrs p{c(q), c(k), c(v), c(dout), doc, lse, delta, m(dq), m(dk), m(dv)};
  if (a.D == 64) return launch_backward_mma<64>(p, a, s);
  if (a.D == 128) return launch_backward_mma<128>(p, a, s);
  return cudaErrorInvalidValue;
}

}  // namespace shardwise::cuda::launch
