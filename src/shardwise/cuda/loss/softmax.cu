// Softmax over the last dim, forward and backward, f32 (ops/softmax/kernels.cc's f32 rows): one
// block per row; the row's max, the exponentials exp(x - max) in float (0 below e^-80, as the CPU
// flushes them), their sum in double, then one multiplication by the float 1 / sum. The backward
// dx = y (dy - sum(dy y)), the sum in double and each element in double rounded once. Block sums
// in a fixed order: deterministic.
#include <cuda_runtime.h>

#include <cfloat>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::block_reduce;
using detail::kBlock;

__global__ void softmax_fwd(const float* x, float* y, long long cols) {
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  float m = -INFINITY;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  m = block_reduce<float, true>(m);
  double sum = 0.0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = row[c] - m;
    const float e = d < -80.0f ? 0.0f : expf(d);
    out[c] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / block_reduce(sum));
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[c] *= inv;  // this thread's own elements
}

__global__ void softmax_bwd(const float* y, const float* dy, float* dx, long long cols) {
  const long long base = blockIdx.x * cols;
  double s = 0.0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += static_cast<double>(dy[base + c]) * y[base + c];
  s = block_reduce(s);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[base + c] = static_cast<float>(static_cast<double>(y[base + c]) * (static_cast<double>(dy[base + c]) - s));
  }
}

}  // namespace

int softmax_forward(const float* x, float* y, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  softmax_fwd<<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(s)>>>(x, y, cols);
  return cudaGetLastError();
}

int softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  softmax_bwd<<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(s)>>>(y, dy, dx, cols);
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
