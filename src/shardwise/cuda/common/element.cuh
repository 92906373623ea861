#pragma once
// The element types the f32 / bf16 / f16 kernels read and write, as float: to_f(x) and from_f<T>(x)
// (round to nearest even, as shardwise's bf16 and f16 do on the host).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace shardwise::cuda::detail {

__device__ inline float to_f(float x) { return x; }
__device__ inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_f(__half x) { return __half2float(x); }
template <class T>
__device__ T from_f(float x);
template <>
__device__ inline float from_f<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_f<__half>(float x) { return __float2half_rn(x); }

}  // namespace shardwise::cuda::detail
