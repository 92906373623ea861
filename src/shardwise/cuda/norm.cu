// LayerNorm and RMSNorm, forward and backward: one block per row, the row's sums in double (as
// the CPU kernels of ops/norm compute each row in double and round once); the parameter gradients
// (dscale, dbias) one thread per column summing its column over every row in row order, in double:
// no atomics, so every run gives the same bits.
#include <cuda_runtime.h>

#include "shardwise/cuda/block_reduce.cuh"
#include "shardwise/cuda/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::block_reduce;
using detail::kBlock;

__global__ void layer_norm_fwd(const float* x, const float* scale, const float* bias, float* out, float* mean_out,
                               float* rstd_out, long long cols, double eps) {
  const float* xr = x + blockIdx.x * cols;
  double sum = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
  const double mean = block_reduce(sum) / static_cast<double>(cols);
  double sq = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sq += (xr[c] - mean) * (xr[c] - mean);
  const double rstd = 1.0 / sqrt(block_reduce(sq) / static_cast<double>(cols) + eps);
  float* o = out + blockIdx.x * cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    o[c] = static_cast<float>((xr[c] - mean) * rstd * scale[c] + bias[c]);
  }
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = static_cast<float>(mean);
    rstd_out[blockIdx.x] = static_cast<float>(rstd);
  }
}

// dx of layer_norm (`has_mean`) or rms_norm: g = dout * scale, xhat = (x - mean) * rstd,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (rms_norm: no mean(g) term).
__global__ void norm_dx(const float* x, const float* scale, const float* mean, const float* rstd,
                        const float* dout, float* dx, long long cols, bool has_mean) {
  const long long off = blockIdx.x * cols;
  const double mu = has_mean ? mean[blockIdx.x] : 0.0, r = rstd[blockIdx.x];
  double sg = 0, sgx = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(dout[off + c]) * scale[c];
    sg += g;
    sgx += g * (x[off + c] - mu) * r;
  }
  const double mg = has_mean ? block_reduce(sg) / static_cast<double>(cols) : 0.0;
  const double mgx = block_reduce(sgx) / static_cast<double>(cols);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(dout[off + c]) * scale[c];
    const double xhat = (x[off + c] - mu) * r;
    dx[off + c] = static_cast<float>(r * (g - mg - xhat * mgx));
  }
}

// dscale[c] = sum over rows of dout * xhat, dbias[c] = sum over rows of dout (when dbias).
__global__ void norm_dparams(const float* x, const float* mean, const float* rstd, const float* dout, float* dscale,
                             float* dbias, long long rows, long long cols) {
  const long long c = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  double ds = 0, db = 0;
  for (long long r = 0; r < rows; ++r) {
    const double d = dout[r * cols + c];
    const double mu = mean != nullptr ? mean[r] : 0.0;
    ds += d * (x[r * cols + c] - mu) * rstd[r];
    db += d;
  }
  dscale[c] = static_cast<float>(ds);
  if (dbias != nullptr) dbias[c] = static_cast<float>(db);
}

__global__ void rms_norm_fwd(const float* x, const float* scale, float* out, float* inv_out, long long cols,
                             double eps) {
  const float* xr = x + blockIdx.x * cols;
  double sq = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sq += static_cast<double>(xr[c]) * xr[c];
  const double inv = 1.0 / sqrt(block_reduce(sq) / static_cast<double>(cols) + eps);
  float* o = out + blockIdx.x * cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) o[c] = static_cast<float>(xr[c] * inv * scale[c]);
  if (threadIdx.x == 0) inv_out[blockIdx.x] = static_cast<float>(inv);
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }

int dparams(const float* x, const float* mean, const float* rstd, const float* dout, float* dscale, float* dbias,
            int64_t rows, int64_t cols, void* s) {
  norm_dparams<<<static_cast<unsigned>((cols + kBlock - 1) / kBlock), kBlock, 0, raw(s)>>>(x, mean, rstd, dout,
                                                                                        dscale, dbias, rows, cols);
  return cudaGetLastError();
}

}  // namespace

int layer_norm_forward(const float* x, const float* scale, const float* bias, float* out, float* mean, float* rstd,
                       int64_t rows, int64_t cols, double eps, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  layer_norm_fwd<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(x, scale, bias, out, mean, rstd, cols, eps);
  return cudaGetLastError();
}

int layer_norm_backward(const float* x, const float* scale, const float* mean, const float* rstd, const float* dout,
                        float* dx, float* dscale, float* dbias, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  norm_dx<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(x, scale, mean, rstd, dout, dx, cols, true);
  const int status = cudaGetLastError();
  return status != cudaSuccess ? status : dparams(x, mean, rstd, dout, dscale, dbias, rows, cols, s);
}

int rms_norm_forward(const float* x, const float* scale, float* out, float* inv_rms, int64_t rows, int64_t cols,
                     double eps, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  rms_norm_fwd<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(x, scale, out, inv_rms, cols, eps);
  return cudaGetLastError();
}

int rms_norm_backward(const float* x, const float* scale, const float* inv_rms, const float* dout, float* dx,
                      float* dscale, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  norm_dx<<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(x, scale, nullptr, inv_rms, dout, dx, cols, false);
  const int status = cudaGetLastError();
  return status != cudaSuccess ? status : dparams(x, nullptr, inv_rms, dout, dscale, nullptr, rows, cols, s);
}

}  // namespace shardwise::cuda::launch
