// The tensor-core forward of the fused causal attention, bf16 with head dim 64 or 128
// (FlashAttention-2 on wmma fragments): one block of 4 warps per (query head, 64 query rows), warp
// w owning rows [16 w, 16 w + 16) of every tile. The keys stream through shared memory 64 at a
// time, never past the last visible tile. Per key tile a warp computes its rows' scores
// S = Q K^T (f32) into shared memory, then its 32 lanes (two a row, attention_mma_plan.h) take the
// online softmax as the FMA kernel does (running max m, sum l, the output rescaled by
// exp(m_old - m_new)), write P as bf16 and O += P V on the fragments, O kept in shared memory as
// f32. The output divides by the sum of the bf16-rounded P (the weights the product used), lse =
// m + log(l) by the float sum. One owner per value, no atomics: the same bits every run.
#include "shardwise/cuda/layers/attention_mma.cuh"

#include <cfloat>
#include <cmath>

namespace shardwise::cuda::launch {

namespace {

using namespace detail;  // attention_tile.cuh, attention_mma.cuh

template <int D>
__global__ void __launch_bounds__(mp::kThreads)
    attn_forward_mma(const bf16* q, const bf16* k, const bf16* v, const long long* doc, bf16* out, float* lse,
                     AttnDims a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr mp::ForwardSmem L = mp::forward_smem(D);
  constexpr int ldh = mp::ld_bf16(D), lds = mp::ld_f32(mp::kTile), ldp = mp::ld_bf16(mp::kTile), ldo = mp::ld_f32(D);
  bf16 *Qs = reinterpret_cast<bf16*>(smem + L.q), *Ks = reinterpret_cast<bf16*>(smem + L.k);
  bf16 *Vs = reinterpret_cast<bf16*>(smem + L.v), *Ps = reinterpret_cast<bf16*>(smem + L.p);
  float *Ss = reinterpret_cast<float*>(smem + L.s), *Os = reinterpret_cast<float*>(smem + L.o);
  const long long head = blockIdx.x, S = a.S, b = head / (a.G * a.R), kv = head / a.R;
  const long long i0 = static_cast<long long>(blockIdx.y) * mp::kTile;
  const int ni = mp::tile_rows(i0, S);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * mp::kWarpRows;
  const int row = w0 + mp::lane_row(lane), c0 = mp::lane_col0(lane, mp::kTile), d0 = mp::lane_col0(lane, D);
  const long long i = i0 + row;
  const long long* doc_b = doc == nullptr ? nullptr : doc + b * S;
  load_bf16_rows<D>(q + (head * S + i0) * D, ni, Qs);
  zero_f32_tile(Os, D);
  float m = -INFINITY, l = 0.0f, lh = 0.0f;  // lh: the sum of the rounded P
  for (long long j0 = 0; j0 < mp::key_end(i0, ni); j0 += mp::kTile) {
    const int nj = mp::tile_rows(j0, S);
    __syncthreads();  // every warp is done with the previous K and V (and Q, O are written)
    load_bf16_rows<D>(k + (kv * S + j0) * D, nj, Ks);
    load_bf16_rows<D>(v + (kv * S + j0) * D, nj, Vs);
    __syncthreads();
    warp_abt<D>(Qs + mp::frag_at(ldh, w0, 0), ldh, Ks, ldh, Ss + mp::frag_at(lds, w0, 0), lds);
    __syncwarp();  // the warp's S rows are in shared memory
    float mx = -INFINITY;
    for (int c = c0; c < c0 + mp::kTile / 2; ++c) {
      const bool on = row < ni && c < nj && visible(i, j0 + c, doc_b);
      if (on) mx = fmaxf(mx, Ss[mp::frag_at(lds, row, c)] * a.scale);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mnew = fmaxf(m, mx);
    const bool none = mnew == -INFINITY;  // nothing visible to this row yet (a later document)
    const float alpha = none ? 1.0f : exp_of(m - mnew);
    float sum = 0.0f, sumh = 0.0f;
    for (int c = c0; c < c0 + mp::kTile / 2; ++c) {
      const bool on = !none && row < ni && c < nj && visible(i, j0 + c, doc_b);
      const float p = on ? exp_of(Ss[mp::frag_at(lds, row, c)] * a.scale - mnew) : 0.0f;
      const bf16 ph = __float2bfloat16_rn(p);
      Ps[mp::frag_at(ldp, row, c)] = ph;
      sum += p;
      sumh += __bfloat162float(ph);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sumh += __shfl_xor_sync(0xffffffffu, sumh, 1);
    if (!none) m = mnew;
    l = l * alpha + sum;
    lh = lh * alpha + sumh;
    for (int d = d0; d < d0 + D / 2; ++d) Os[mp::frag_at(ldo, row, d)] *= alpha;
    __syncwarp();  // the warp's P rows and rescaled O rows are written
    warp_acc_ab<wm::row_major, D>(Ps + mp::frag_at(ldp, w0, 0), ldp, Vs, ldh, Os + mp::frag_at(ldo, w0, 0), ldo);
  }
  __syncwarp();  // the warp's last O rows are stored
  store_rows_bf16<D>(Os, ni, lh > 0.0f ? 1.0f / lh : 0.0f, out + (head * S + i0) * D);
  if (row < ni && (lane & 1) == 0) {
    lse[head * S + i] = l > 0.0f ? static_cast<float>(static_cast<double>(m) + log(static_cast<double>(l))) : -INFINITY;
  }
}

template <int D>
int launch_forward_mma(const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                       const AttnDims& a, cudaStream_t stream) {
  constexpr size_t bytes = mp::forward_smem(D).total;
  static_assert(bytes <= mp::kMaxSmem, "the forward's shared memory exceeds sm_90's");
  auto kernel = attn_forward_mma<D>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.heads()), static_cast<unsigned>((a.S + mp::kTile - 1) / mp::kTile));
  kernel<<<grid, mp::kThreads, bytes, stream>>>(static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                                                 static_cast<const bf16*>(v), reinterpret_cast<const long long*>(doc),
                                                 static_cast<bf16*>(out), lse, a);
  return cudaGetLastError();
}

}  // namespace

int attention_forward_mma(const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                          const detail::AttnDims& a, cudaStream_t s) {
  if (a.D == 64) return launch_forward_mma<64>(q, k, v, doc, out, lse, a, s);
  if (a.D == 128) return launch_forward_mma<128>(q, k, v, doc, out, lse, a, s);
  return cudaErrorInvalidValue;
}

}  // namespace shardwise::cuda::launch
