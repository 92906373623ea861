// The fused LM head's row kernels: one block per row of a chunk's logits, sums in double in a
// fixed order (block_reduce.cuh), as ops/softmax's cross_entropy_local_max / _local_sums /
// cross_entropy_grad_in_place compute each row: deterministic.
#include <cuda_runtime.h>

#include <cfloat>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/loss/lm_head_launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::block_reduce;
using detail::kBlock;

__global__ void row_max_kernel(const float* logits, double* row_max, long long cols) {
  const float* row = logits + blockIdx.x * cols;
  float m = -INFINITY;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  m = block_reduce<float, true>(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void row_sums_kernel(const float* logits, const long long* labels, const double* row_max, double* sum_exp,
                                double* target, long long cols, long long offset, long long ignore_index) {
  const long long r = blockIdx.x, label = labels[r];
  const float* row = logits + r * cols;
  const double m = row_max[r];
  double sum = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sum += exp(static_cast<double>(row[c]) - m);
  sum = block_reduce(sum);
  if (threadIdx.x == 0) {
    sum_exp[r] = sum;
    const bool here = label != ignore_index && label >= offset && label < offset + cols;
    target[r] = here ? static_cast<double>(row[label - offset]) : 0.0;
  }
}

__global__ void row_finish_kernel(float* logits, const long long* labels, const double* row_max,
                                  const double* sum_exp, const double* target, float* loss, long long cols,
                                  long long offset, long long ignore_index, bool grads, double grad_scale, bool mean,
                                  const double* count) {
  const long long r = blockIdx.x, label = labels[r];
  const bool ignored = label == ignore_index;
  const double m = row_max[r], s = sum_exp[r];
  if (threadIdx.x == 0) loss[r] = ignored ? 0.0f : static_cast<float>(m + log(s) - target[r]);
  if (!grads) return;
  float* row = logits + r * cols;
  const double w = ignored ? 0.0 : (mean ? grad_scale / count[0] : grad_scale);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const double p = exp(static_cast<double>(row[c]) - m) / s;
    row[c] = static_cast<float>((p - (c + offset == label ? 1.0 : 0.0)) * w);
  }
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }
const long long* ll(const int64_t* p) { return reinterpret_cast<const long long*>(p); }

}  // namespace

int lm_head_row_max(const float* logits, double* row_max, int64_t rows, int64_t cols, void* s) {
  if (rows == 0) return cudaSuccess;
  row_max_kernel<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(logits, row_max, cols);
  return cudaGetLastError();
}

int lm_head_row_sums(const float* logits, const int64_t* labels, const double* row_max, double* sum_exp,
                     double* target, int64_t rows, int64_t cols, int64_t offset, int64_t ignore_index, void* s) {
  if (rows == 0) return cudaSuccess;
  row_sums_kernel<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(logits, ll(labels), row_max, sum_exp, target,
                                                                      cols, offset, ignore_index);
  return cudaGetLastError();
}

int lm_head_row_finish(float* logits, const int64_t* labels, const double* row_max, const double* sum_exp,
                       const double* target, float* loss, int64_t rows, int64_t cols, int64_t offset,
                       int64_t ignore_index, bool grads, double grad_scale, bool mean, const double* count, void* s) {
  if (rows == 0) return cudaSuccess;
  row_finish_kernel<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(
      logits, ll(labels), row_max, sum_exp, target, loss, cols, offset, ignore_index, grads, grad_scale, mean, count);
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
