#pragma once
// Block-wide sums in a fixed order (warp shuffles, then the warps' sums by warp 0): the same bits
// on every run for the same block size, so the kernels built on them are deterministic.
#include <cuda_runtime.h>

namespace shardwise::cuda::detail {

inline constexpr int kBlock = 256;

template <class T>
__device__ T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <class T>
__device__ T warp_max(T v) {
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Every thread of the block gets the sum (max) of `v` over the block; blockDim.x a multiple of 32.
template <class T, bool kMax = false>
__device__ T block_reduce(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // partial[] may still be read from a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T r = lane < warps ? partial[lane] : (kMax ? partial[0] : T(0));
  r = kMax ? warp_max(r) : warp_sum(r);
  return r;
}

inline unsigned grid_for(long long n, int block = kBlock) {
  long long g = (n + block - 1) / block;
  return static_cast<unsigned>(g < 65536 * 8 ? (g < 1 ? 1 : g) : 65536 * 8);
}

}  // namespace shardwise::cuda::detail
