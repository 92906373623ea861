#pragma once
// GELU (tanh approximation, GPT-2) and SiLU with their derivatives, in float like the CPU kernels
// (ops/unary): shared by the f32 activation kernels (elementwise.cu) and the unary family (unary.cu).
#include <cuda_runtime.h>

namespace shardwise::cuda::detail {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

__device__ inline float gelu(float x) { return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluC * x * x * x))); }
__device__ inline float gelu_grad(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kGeluC * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
}
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float silu(float x) { return x * sigmoid(x); }
__device__ inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

}  // namespace shardwise::cuda::detail
