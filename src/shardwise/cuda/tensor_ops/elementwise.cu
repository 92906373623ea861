// GELU (tanh approximation, GPT-2), SiLU and the AdamW update (and the bf16 copy of the updated
// f32 master, when the parameter is bf16): elementwise, a grid-stride loop,
// in float like the CPU kernels (ops/unary, train/optimizer.cc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "shardwise/cuda/common/activation.cuh"
#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::gelu;
using detail::gelu_grad;
using detail::silu;
using detail::silu_grad;

template <Activation kOp>
__global__ void forward_kernel(const float* x, float* y, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    y[i] = kOp == Activation::Gelu ? gelu(x[i]) : silu(x[i]);
  }
}

template <Activation kOp>
__global__ void backward_kernel(const float* x, const float* dy, float* dx, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    dx[i] = dy[i] * (kOp == Activation::Gelu ? gelu_grad(x[i]) : silu_grad(x[i]));
  }
}

__global__ void adamw_kernel(float* w, float* m, float* v, const float* g, __nv_bfloat16* param, long long n,
                             AdamWScalars c) {
  for (long long j = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float mj = c.beta1 * m[j] + (1.0f - c.beta1) * g[j];
    const float vj = c.beta2 * v[j] + (1.0f - c.beta2) * g[j] * g[j];
    m[j] = mj;
    v[j] = vj;
    w[j] = w[j] * c.decay - c.step_size * mj / (sqrtf(vj) * c.inv_bc2_sqrt + c.eps);
    if (param != nullptr) param[j] = __float2bfloat16_rn(w[j]);
  }
}

}  // namespace

int activation_forward(Activation op, const float* x, float* y, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  auto stream = static_cast<cudaStream_t>(s);
  const unsigned grid = detail::grid_for(n);
  if (op == Activation::Gelu) {
    forward_kernel<Activation::Gelu><<<grid, detail::kBlock, 0, stream>>>(x, y, n);
  } else {
    forward_kernel<Activation::Silu><<<grid, detail::kBlock, 0, stream>>>(x, y, n);
  }
  return cudaGetLastError();
}

int activation_backward(Activation op, const float* x, const float* dy, float* dx, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  auto stream = static_cast<cudaStream_t>(s);
  const unsigned grid = detail::grid_for(n);
  if (op == Activation::Gelu) {
    backward_kernel<Activation::Gelu><<<grid, detail::kBlock, 0, stream>>>(x, dy, dx, n);
  } else {
    backward_kernel<Activation::Silu><<<grid, detail::kBlock, 0, stream>>>(x, dy, dx, n);
  }
  return cudaGetLastError();
}

int adamw(float* w, float* m, float* v, const float* g, void* param_bf16, int64_t n, AdamWScalars c, void* s) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<detail::grid_for(n), detail::kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      w, m, v, g, static_cast<__nv_bfloat16*>(param_bf16), n, c);
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
