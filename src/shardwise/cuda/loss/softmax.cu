// Softmax over the last dim, forward and backward, f32 or bf16 (ops/softmax/kernels.cc's rows;
// bf16 read and written as bf16, computed as f32): one block per row; the row's max, the
// exponentials exp(x - max) in float (0 below e^-80, as the CPU flushes them), their sum in double,
// then each exponential (recomputed: the same float) times the float 1 / sum, rounded once to the
// element type. The backward dx = y (dy - sum(dy y)), the sum in double and each element in double
// rounded once (to bf16 directly, as the CPU's from_f64). Block sums in a fixed order:
// deterministic.
#include <cuda_runtime.h>

#include <cfloat>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/element.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::block_reduce;
using detail::from_f;
using detail::to_f;
using detail::kBlock;

// A double rounded once to the element type.
template <class T>
__device__ T from_double(double x);
template <>
__device__ inline float from_double<float>(double x) { return static_cast<float>(x); }
template <>
__device__ inline __nv_bfloat16 from_double<__nv_bfloat16>(double x) { return __double2bfloat16(x); }

__device__ inline float exp_shifted(float d) { return d < -80.0f ? 0.0f : expf(d); }

template <class T>
__global__ void softmax_fwd(const T* x, T* y, long long cols) {
  const T* row = x + blockIdx.x * cols;
  T* out = y + blockIdx.x * cols;
  float m = -INFINITY;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, to_f(row[c]));
  m = block_reduce<float, true>(m);
  double sum = 0.0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sum += exp_shifted(to_f(row[c]) - m);
  const float inv = static_cast<float>(1.0 / block_reduce(sum));
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[c] = from_f<T>(exp_shifted(to_f(row[c]) - m) * inv);
}

template <class T>
__global__ void softmax_bwd(const T* y, const T* dy, T* dx, long long cols) {
  const long long base = blockIdx.x * cols;
  double s = 0.0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    s += static_cast<double>(to_f(dy[base + c])) * to_f(y[base + c]);
  }
  s = block_reduce(s);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[base + c] = from_double<T>(static_cast<double>(to_f(y[base + c])) * (static_cast<double>(to_f(dy[base + c])) - s));
  }
}

template <class T>
int forward_of(const void* x, void* y, int64_t rows, int64_t cols, cudaStream_t s) {
  softmax_fwd<T><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), cols);
  return cudaGetLastError();
}

template <class T>
int backward_of(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, cudaStream_t s) {
  softmax_bwd<T><<<static_cast<unsigned>(rows), kBlock, 0, s>>>(static_cast<const T*>(y), static_cast<const T*>(dy),
                                                                static_cast<T*>(dx), cols);
  return cudaGetLastError();
}

}  // namespace

int softmax_forward(Elem e, const void* x, void* y, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  auto stream = static_cast<cudaStream_t>(s);
  return e == Elem::F32 ? forward_of<float>(x, y, rows, cols, stream) : forward_of<__nv_bfloat16>(x, y, rows, cols, stream);
}

int softmax_backward(Elem e, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  auto stream = static_cast<cudaStream_t>(s);
  return e == Elem::F32 ? backward_of<float>(y, dy, dx, rows, cols, stream)
                        : backward_of<__nv_bfloat16>(y, dy, dx, rows, cols, stream);
}

}  // namespace shardwise::cuda::launch
