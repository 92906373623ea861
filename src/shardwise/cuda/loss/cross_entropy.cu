// Softmax cross-entropy over the last dim: one block per row (max, then the sum of exponentials
// in double, lse = max + log(sum)); the backward recomputes the row's softmax from the logits as
// the CPU kernel (ops/softmax) does. The reduction over rows is one block summing in a fixed
// order: deterministic.
#include <cuda_runtime.h>

#include <cfloat>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::block_reduce;
using detail::kBlock;

__device__ double row_lse(const float* row, long long classes) {
  float m = -FLT_MAX;
  for (long long c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, row[c]);
  m = block_reduce<float, true>(m);
  double sum = 0;
  for (long long c = threadIdx.x; c < classes; c += blockDim.x) sum += exp(static_cast<double>(row[c]) - m);
  return m + log(block_reduce(sum));
}

__device__ bool label_ok(long long label, long long classes, long long ignore_index, long long row,
                         long long* bad) {
  if (label == ignore_index || (label >= 0 && label < classes)) return true;
  if (threadIdx.x == 0) atomicCAS(reinterpret_cast<unsigned long long*>(bad), 0ull, static_cast<unsigned long long>(row + 1));
  return false;
}

__global__ void ce_rows(const float* logits, const long long* labels, float* loss, long long classes,
                        long long ignore_index, long long* bad) {
  const long long r = blockIdx.x, label = labels[r];
  const float* row = logits + r * classes;
  if (!label_ok(label, classes, ignore_index, r, bad)) {
    if (threadIdx.x == 0) loss[r] = __int_as_float(0x7fc00000);  // NaN; the caller raises the error
    return;
  }
  if (label == ignore_index) {
    if (threadIdx.x == 0) loss[r] = 0.0f;
    return;
  }
  const double lse = row_lse(row, classes);
  if (threadIdx.x == 0) loss[r] = static_cast<float>(lse - row[label]);
}

__global__ void ce_reduce(const float* loss, const long long* labels, float* out, double* count, long long rows,
                          long long ignore_index, Reduction reduction) {
  double sum = 0, n = 0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    sum += loss[r];
    n += labels[r] != ignore_index ? 1.0 : 0.0;
  }
  sum = block_reduce(sum);
  n = block_reduce(n);
  if (threadIdx.x == 0) {
    out[0] = static_cast<float>(reduction == Reduction::Mean ? sum / n : sum);
    count[0] = n;
  }
}

__global__ void ce_backward(const float* logits, const long long* labels, const float* dloss, const double* count,
                            float* dlogits, long long classes, long long ignore_index, Reduction reduction) {
  const long long r = blockIdx.x, label = labels[r];
  const float* row = logits + r * classes;
  float* d = dlogits + r * classes;
  if (label == ignore_index || label < 0 || label >= classes) {
    for (long long c = threadIdx.x; c < classes; c += blockDim.x) d[c] = 0.0f;
    return;
  }
  const double w = reduction == Reduction::None ? dloss[r]
                   : reduction == Reduction::Sum ? dloss[0]
                                                 : dloss[0] / count[0];
  const double lse = row_lse(row, classes);
  for (long long c = threadIdx.x; c < classes; c += blockDim.x) {
    d[c] = static_cast<float>((exp(static_cast<double>(row[c]) - lse) - (c == label ? 1.0 : 0.0)) * w);
  }
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }
const long long* ll(const int64_t* p) { return reinterpret_cast<const long long*>(p); }

}  // namespace

int cross_entropy_rows(const float* logits, const int64_t* labels, float* loss, int64_t rows, int64_t classes,
                       int64_t ignore_index, int64_t* bad, void* s) {
  if (rows == 0) return cudaSuccess;
  ce_rows<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(logits, ll(labels), loss, classes, ignore_index,
                                                              reinterpret_cast<long long*>(bad));
  return cudaGetLastError();
}

int cross_entropy_reduce(const float* loss, const int64_t* labels, float* out, double* count, int64_t rows,
                         int64_t ignore_index, Reduction reduction, void* s) {
  ce_reduce<<<1, 1024, 0, raw(s)>>>(loss, ll(labels), out, count, rows, ignore_index, reduction);
  return cudaGetLastError();
}

int cross_entropy_backward(const float* logits, const int64_t* labels, const float* dloss, const double* count,
                           float* dlogits, int64_t rows, int64_t classes, int64_t ignore_index, Reduction reduction,
                           void* s) {
  if (rows == 0) return cudaSuccess;
  ce_backward<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(logits, ll(labels), dloss, count, dlogits, classes,
                                                                  ignore_index, reduction);
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
