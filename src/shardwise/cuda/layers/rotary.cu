// Rotary position embeddings forward and backward (ops/rotary/kernels.cc's conventions): one
// thread per (row, i < D / 2) pair, rotating x[i] and x[i + D/2] by the row's angle. inv_freq is
// computed as the CPU computes it (the exponent 2i / D in float, theta^e in double rounded to
// float, its reciprocal in float), the angle pos * inv_freq in float, and cos / sin of that float
// in double rounded to float: the CPU's correctly rounded cosf / sinf, with no table to upload.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/element.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::from_f;
using detail::to_f;

template <class T>
__global__ void rotate(const T* x, T* out, const void* positions, bool pos_i32, RotaryShape r, float sign) {
  const long long h = r.head_dim / 2, n = r.rows * h;
  for (long long e = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long row = e / h, i = e % h;
    const long long p = (r.per_batch > 0 ? (row / r.per_batch) * r.seq : 0) + row % r.seq;
    const long long pos = pos_i32 ? static_cast<const int*>(positions)[p] : static_cast<const long long*>(positions)[p];
    const float ex = static_cast<float>(2 * i) / static_cast<float>(r.head_dim);
    const float inv = 1.0f / static_cast<float>(pow(static_cast<double>(r.theta), static_cast<double>(ex)));
    const float a = static_cast<float>(pos) * inv;
    double sd, cd;
    sincos(static_cast<double>(a), &sd, &cd);
    const float c = static_cast<float>(cd), s = sign * static_cast<float>(sd);
    const T* xr = x + row * r.head_dim;
    T* o = out + row * r.head_dim;
    const float u = to_f(xr[i]), w = to_f(xr[i + h]);
    o[i] = from_f<T>(__fsub_rn(__fmul_rn(u, c), __fmul_rn(w, s)));  // no FMA contraction: the CPU's rounding
    o[i + h] = from_f<T>(__fadd_rn(__fmul_rn(w, c), __fmul_rn(u, s)));
  }
}

}  // namespace

int rotary(Elem e, const void* x, void* out, const void* positions, bool positions_i32, const RotaryShape& r, int sign,
           void* s) {
  const long long n = r.rows * (r.head_dim / 2);
  if (n == 0) return cudaSuccess;
  auto stream = static_cast<cudaStream_t>(s);
  const unsigned grid = detail::grid_for(n);
  const float sg = static_cast<float>(sign);
  if (e == Elem::F32) {
    rotate<float><<<grid, detail::kBlock, 0, stream>>>(static_cast<const float*>(x), static_cast<float*>(out),
                                                       positions, positions_i32, r, sg);
  } else {
    rotate<__nv_bfloat16><<<grid, detail::kBlock, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(out), positions, positions_i32, r, sg);
  }
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
