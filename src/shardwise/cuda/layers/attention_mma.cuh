#pragma once
// What the tensor-core attention kernels (attention_mma_forward.cu, attention_mma_backward.cu)
// share: bf16 tile loads into shared memory and the two warp-level products on wmma m16n16k16
// fragments (bf16 operands, f32 accumulators). Every warp works on its own 16 rows of a 64-row
// tile; the shared memory layout and offsets are attention_mma_plan.h's. sm_80 or newer.
#include <cuda_bf16.h>
#include <mma.h>

#include <type_traits>

#include "shardwise/cuda/layers/attention_mma_plan.h"
#include "shardwise/cuda/layers/attention_tile.cuh"

namespace shardwise::cuda::detail {

using bf16 = __nv_bfloat16;
namespace wm = nvcuda::wmma;
namespace mp = mma_plan;

// Rows [0, n) of the [*, D] bf16 matrix at src (16-byte aligned, D a multiple of 8) into the smem
// tile dst [64, ld_bf16(D)], 8 elements (16 bytes) a load; rows n.. zero. All threads of the block.
template <int D>
__device__ void load_bf16_rows(const bf16* src, int n, bf16* dst) {
  constexpr int kVec = 8, kPerRow = D / kVec;
  for (int e = threadIdx.x; e < mp::kTile * kPerRow; e += blockDim.x) {
    const int r = e / kPerRow, c = (e % kPerRow) * kVec;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r < n) val = *reinterpret_cast<const uint4*>(src + static_cast<long long>(r) * D + c);
    *reinterpret_cast<uint4*>(dst + mp::frag_at(mp::ld_bf16(D), r, c)) = val;
  }
}

// Zeros a [64, cols] f32 smem tile of row stride ld_f32(cols). All threads of the block.
__device__ inline void zero_f32_tile(float* t, int cols) {
  for (int e = threadIdx.x; e < mp::kTile * cols; e += blockDim.x) t[mp::frag_at(mp::ld_f32(cols), e / cols, e % cols)] = 0.0f;
}

// C [16, 64] = A [16, K] B[64, K]^T for one warp: A the warp's rows of a row-major bf16 tile (row
// stride lda), B the 64 rows of another (ldb), C into a row-major f32 tile (ldc). S = Q K^T and
// dP = dO V^T. K^T as a matrix_b is B read column-major.
template <int K>
__device__ void warp_abt(const bf16* A, int lda, const bf16* B, int ldb, float* C, int ldc) {
  wm::fragment<wm::matrix_a, 16, 16, 16, bf16, wm::row_major> a;
  wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::col_major> b;
  wm::fragment<wm::accumulator, 16, 16, 16, float> c;
#pragma unroll
  for (int n = 0; n < mp::kTile; n += mp::kFrag) {
    wm::fill_fragment(c, 0.0f);
#pragma unroll
    for (int k = 0; k < K; k += mp::kFrag) {
      wm::load_matrix_sync(a, A + mp::frag_at(lda, 0, k), lda);
      wm::load_matrix_sync(b, B + mp::frag_at(ldb, n, k), ldb);
      wm::mma_sync(c, a, b, c);
    }
    wm::store_matrix_sync(C + mp::frag_at(ldc, 0, n), c, ldc, wm::mem_row_major);
  }
}

// C [16, N] += A [16, 64] B [64, N] for one warp, C a row-major f32 tile (ldc) read and written
// back, B a row-major bf16 tile (ldb). ALayout row_major: A is the warp's rows of a row-major
// [rows, 64] bf16 tile (lda) (O += P V, dQ += dS K); col_major: A is the transpose of 16 columns of
// a row-major [64, cols] tile, its element (m, k) at A[k lda + m] (dV += P^T dO, dK += dS^T Q).
template <class ALayout, int N>
__device__ void warp_acc_ab(const bf16* A, int lda, const bf16* B, int ldb, float* C, int ldc) {
  wm::fragment<wm::matrix_a, 16, 16, 16, bf16, ALayout> a;
  wm::fragment<wm::matrix_b, 16, 16, 16, bf16, wm::row_major> b;
  wm::fragment<wm::accumulator, 16, 16, 16, float> c;
  constexpr bool kRowMajor = std::is_same<ALayout, wm::row_major>::value;
#pragma unroll
  for (int n = 0; n < N; n += mp::kFrag) {
    wm::load_matrix_sync(c, C + mp::frag_at(ldc, 0, n), ldc, wm::mem_row_major);
#pragma unroll
    for (int k = 0; k < mp::kTile; k += mp::kFrag) {
      wm::load_matrix_sync(a, kRowMajor ? A + mp::frag_at(lda, 0, k) : A + mp::frag_at(lda, k, 0), lda);
      wm::load_matrix_sync(b, B + mp::frag_at(ldb, k, n), ldb);
      wm::mma_sync(c, a, b, c);
    }
    wm::store_matrix_sync(C + mp::frag_at(ldc, 0, n), c, ldc, wm::mem_row_major);
  }
}

// Writes rows [0, n) of the f32 smem tile T [64, D] times `mul` to dst [*, D] as bf16; lane l of
// warp w writes row 16 w + lane_row(l), cols [lane_col0(l, D), + D / 2).
template <int D>
__device__ void store_rows_bf16(const float* T, int n, float mul, bf16* dst) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = warp * mp::kWarpRows + mp::lane_row(lane), c0 = mp::lane_col0(lane, D);
  if (r >= n) return;
#pragma unroll 8
  for (int c = c0; c < c0 + D / 2; ++c) {
    dst[static_cast<long long>(r) * D + c] = __float2bfloat16_rn(T[mp::frag_at(mp::ld_f32(D), r, c)] * mul);
  }
}

}  // namespace shardwise::cuda::detail

namespace shardwise::cuda::launch {

// The tensor-core passes (bf16, head dim 64 or 128: mma_plan::use_tensor_cores), called by
// attention_forward / attention_backward (attention_forward.cu, attention_backward.cu) after their
// checks; the backward's delta is computed before (its FMA kernel's delta pass).
int attention_forward_mma(const void* q, const void* k, const void* v, const int64_t* doc, void* out, float* lse,
                          const detail::AttnDims& a, cudaStream_t s);
int attention_backward_mma(const void* q, const void* k, const void* v, const long long* doc, const float* lse,
                           const float* delta, const void* dout, void* dq, void* dk, void* dv,
                           const detail::AttnDims& a, cudaStream_t s);

}  // namespace shardwise::cuda::launch
