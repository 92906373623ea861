#pragma once
// Device helpers of the elementwise, reduction and layout kernels (loads and stores of f32 / bf16 /
// f16 through float are element.cuh's): the offsets of a walk (tensor_launchers.h) for a flat
// index, grid-stride loops, and the dispatch of a launcher on the element type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "shardwise/cuda/common/element.cuh"
#include "shardwise/cuda/common/tensor_launchers.h"

namespace shardwise::cuda::detail {

// Operand k's element of flat index i of the walk.
template <int kOperands>
struct Offsets {
  long long at[kOperands];
};
template <int kOperands>
__device__ inline Offsets<kOperands> walk_offsets(const launch::Walk& w, long long i) {
  Offsets<kOperands> o;
  for (int k = 0; k < kOperands; ++k) o.at[k] = w.offset[k];
  for (int d = w.ndim - 1; d >= 0; --d) {
    const long long idx = i % w.shape[d];
    i /= w.shape[d];
    for (int k = 0; k < kOperands; ++k) o.at[k] += idx * w.stride[k][d];
  }
  return o;
}

// Calls fn(T{}) with T the element type of `t` (host side of a launcher).
template <class Fn>
int with_elem(launch::Elem t, Fn&& fn) {
  switch (t) {
    case launch::Elem::F32: return fn(float{});
    case launch::Elem::BF16: return fn(__nv_bfloat16{});
    case launch::Elem::F16: return fn(__half{});
  }
  return cudaErrorInvalidValue;
}

__device__ inline long long first_index() { return blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; }
__device__ inline long long grid_step() { return static_cast<long long>(gridDim.x) * blockDim.x; }

}  // namespace shardwise::cuda::detail
