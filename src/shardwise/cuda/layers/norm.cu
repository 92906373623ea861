// LayerNorm and RMSNorm, forward and backward: one block per row, the row's sums in double (as
// the CPU kernels of ops/norm compute each row in double and round once); the parameter gradients
// (dscale, dbias) one thread per column summing its column over every row in row order, in double:
// no atomics, so every run gives the same bits. x, the parameters, the output and the gradients are
// f32 or bf16 (T; the math in double as for f32), the statistics f32.
#include <cuda_runtime.h>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/launchers.h"
#include "shardwise/cuda/common/walk.cuh"

namespace shardwise::cuda::launch {

namespace {

using detail::block_reduce;
using detail::kBlock;
using detail::from_f;
using detail::to_f;
using detail::with_elem;

template <class T>
__global__ void layer_norm_fwd(const T* x, const T* scale, const T* bias, T* out, float* mean_out,
                               float* rstd_out, long long cols, double eps) {
  const T* xr = x + blockIdx.x * cols;
  double sum = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sum += to_f(xr[c]);
  const double mean = block_reduce(sum) / static_cast<double>(cols);
  double sq = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sq += (to_f(xr[c]) - mean) * (to_f(xr[c]) - mean);
  const double rstd = 1.0 / sqrt(block_reduce(sq) / static_cast<double>(cols) + eps);
  T* o = out + blockIdx.x * cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    o[c] = from_f<T>(static_cast<float>((to_f(xr[c]) - mean) * rstd * to_f(scale[c]) + to_f(bias[c])));
  }
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = static_cast<float>(mean);
    rstd_out[blockIdx.x] = static_cast<float>(rstd);
  }
}

// dx of layer_norm (`has_mean`) or rms_norm: g = dout * scale, xhat = (x - mean) * rstd,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (rms_norm: no mean(g) term).
template <class T>
__global__ void norm_dx(const T* x, const T* scale, const float* mean, const float* rstd, const T* dout, T* dx,
                        long long cols, bool has_mean) {
  const long long off = blockIdx.x * cols;
  const double mu = has_mean ? mean[blockIdx.x] : 0.0, r = rstd[blockIdx.x];
  double sg = 0, sgx = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(to_f(dout[off + c])) * to_f(scale[c]);
    sg += g;
    sgx += g * (to_f(x[off + c]) - mu) * r;
  }
  const double mg = has_mean ? block_reduce(sg) / static_cast<double>(cols) : 0.0;
  const double mgx = block_reduce(sgx) / static_cast<double>(cols);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(to_f(dout[off + c])) * to_f(scale[c]);
    const double xhat = (to_f(x[off + c]) - mu) * r;
    dx[off + c] = from_f<T>(static_cast<float>(r * (g - mg - xhat * mgx)));
  }
}

// dscale[c] = sum over rows of dout * xhat, dbias[c] = sum over rows of dout (when dbias).
template <class T>
__global__ void norm_dparams(const T* x, const float* mean, const float* rstd, const T* dout, T* dscale, T* dbias,
                             long long rows, long long cols) {
  const long long c = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  double ds = 0, db = 0;
  for (long long r = 0; r < rows; ++r) {
    const double d = to_f(dout[r * cols + c]);
    const double mu = mean != nullptr ? mean[r] : 0.0;
    ds += d * (to_f(x[r * cols + c]) - mu) * rstd[r];
    db += d;
  }
  dscale[c] = from_f<T>(static_cast<float>(ds));
  if (dbias != nullptr) dbias[c] = from_f<T>(static_cast<float>(db));
}

template <class T>
__global__ void rms_norm_fwd(const T* x, const T* scale, T* out, float* inv_out, long long cols, double eps) {
  const T* xr = x + blockIdx.x * cols;
  double sq = 0;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sq += static_cast<double>(to_f(xr[c])) * to_f(xr[c]);
  const double inv = 1.0 / sqrt(block_reduce(sq) / static_cast<double>(cols) + eps);
  T* o = out + blockIdx.x * cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    o[c] = from_f<T>(static_cast<float>(to_f(xr[c]) * inv * to_f(scale[c])));
  }
  if (threadIdx.x == 0) inv_out[blockIdx.x] = static_cast<float>(inv);
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }

template <class T>
int dparams(const void* x, const float* mean, const float* rstd, const void* dout, void* dscale, void* dbias,
            int64_t rows, int64_t cols, void* s) {
  norm_dparams<T><<<static_cast<unsigned>((cols + kBlock - 1) / kBlock), kBlock, 0, raw(s)>>>(
      static_cast<const T*>(x), mean, rstd, static_cast<const T*>(dout), static_cast<T*>(dscale),
      static_cast<T*>(dbias), rows, cols);
  return cudaGetLastError();
}

}  // namespace

int layer_norm_forward(Elem t, const void* x, const void* scale, const void* bias, void* out, float* mean,
                       float* rstd, int64_t rows, int64_t cols, double eps, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    layer_norm_fwd<T><<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(out), mean,
        rstd, cols, eps);
    return static_cast<int>(cudaGetLastError());
  });
}

int layer_norm_backward(Elem t, const void* x, const void* scale, const float* mean, const float* rstd,
                        const void* dout, void* dx, void* dscale, void* dbias, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    norm_dx<T><<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(static_cast<const T*>(x), static_cast<const T*>(scale),
                                                                   mean, rstd, static_cast<const T*>(dout),
                                                                   static_cast<T*>(dx), cols, true);
    const int status = cudaGetLastError();
    return status != cudaSuccess ? status : dparams<T>(x, mean, rstd, dout, dscale, dbias, rows, cols, s);
  });
}

int rms_norm_forward(Elem t, const void* x, const void* scale, void* out, float* inv_rms, int64_t rows, int64_t cols,
                     double eps, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    rms_norm_fwd<T><<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<T*>(out), inv_rms, cols, eps);
    return static_cast<int>(cudaGetLastError());
  });
}

int rms_norm_backward(Elem t, const void* x, const void* scale, const float* inv_rms, const void* dout, void* dx,
                      void* dscale, int64_t rows, int64_t cols, void* s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    norm_dx<T><<<static_cast<unsigned>(rows), kBlock, 0, raw(s)>>>(static_cast<const T*>(x), static_cast<const T*>(scale),
                                                                   nullptr, inv_rms, static_cast<const T*>(dout),
                                                                   static_cast<T*>(dx), cols, false);
    const int status = cudaGetLastError();
    return status != cudaSuccess ? status : dparams<T>(x, nullptr, inv_rms, dout, dscale, nullptr, rows, cols, s);
  });
}

}  // namespace shardwise::cuda::launch
