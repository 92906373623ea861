// The collectives' reduction on a device (buffer_reduce.h): the host loop of
// tensor/buffer_reduce.cc per element, in the same compute type and order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "shardwise/cuda/memory/buffer_reduce.h"

namespace shardwise::cuda::launch {
namespace {

struct Inputs {
  const void* at[kMaxReduceInputs];
};

// The compute type of an element type (the host's compute_t: float for f16 / bf16).
template <class T> struct Compute { using type = T; };
template <> struct Compute<__half> { using type = float; };
template <> struct Compute<__nv_bfloat16> { using type = float; };

template <class C, class T> __device__ C load(T x) { return static_cast<C>(x); }
template <> __device__ float load<float, __half>(__half x) { return __half2float(x); }
template <> __device__ float load<float, __nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T, class C> __device__ T store(C x) { return static_cast<T>(x); }
template <> __device__ __half store<__half, float>(float x) { return __float2half_rn(x); }
template <> __device__ __nv_bfloat16 store<__nv_bfloat16, float>(float x) { return __float2bfloat16_rn(x); }

// The host's std::numeric_limits<C>::quiet_NaN().
template <class C> __device__ C quiet_nan() {
  if constexpr (std::is_same<C, double>::value) return __longlong_as_double(0x7ff8000000000000LL);
  else return __int_as_float(0x7fc00000);
}

template <class C> __device__ bool is_nan(C v) {
  if constexpr (std::is_floating_point<C>::value) return v != v;
  else return false;
}

template <class C>
__device__ C combine(C acc, C v, ReduceOp op) {
  if constexpr (std::is_same<C, bool>::value) {
    return op == ReduceOp::Prod ? (acc && v) : op == ReduceOp::Max ? (v > acc ? v : acc)
         : op == ReduceOp::Min ? (v < acc ? v : acc) : (acc || v);
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return static_cast<C>(acc + v);
      case ReduceOp::Prod: return static_cast<C>(acc * v);
      case ReduceOp::Max:
        if constexpr (std::is_floating_point<C>::value) {
          if (is_nan(v) || is_nan(acc)) return quiet_nan<C>();
          if (v == acc && signbit(acc)) acc = v;  // max(-0, +0) = +0 in either order
        }
        return v > acc ? v : acc;
      case ReduceOp::Min:
        if constexpr (std::is_floating_point<C>::value) {
          if (is_nan(v) || is_nan(acc)) return quiet_nan<C>();
          if (v == acc && signbit(v)) acc = v;  // min(-0, +0) = -0 in either order
        }
        return v < acc ? v : acc;
    }
    return acc;
  }
}

template <class T>
__global__ void reduce_kernel(Inputs in, int n, T* out, long long count, ReduceOp op) {
  using C = typename Compute<T>::type;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    C acc = load<C>(static_cast<const T*>(in.at[0])[i]);
    for (int r = 1; r < n; ++r) acc = combine<C>(acc, load<C>(static_cast<const T*>(in.at[r])[i]), op);
    if constexpr (!std::is_same<C, bool>::value) {
      if (op == ReduceOp::Avg) acc = static_cast<C>(acc / static_cast<C>(n));
    }
    out[i] = store<T>(acc);
  }
}

template <class T>
int launch_as(const Inputs& in, int n, void* out, int64_t count, ReduceOp op, void* stream) {
  constexpr int kBlock = 256;
  const long long blocks = (count + kBlock - 1) / kBlock;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  reduce_kernel<T><<<grid, kBlock, 0, static_cast<cudaStream_t>(stream)>>>(in, n, static_cast<T*>(out), count, op);
  return cudaGetLastError();
}

}  // namespace

int reduce_buffers(const void* const* inputs, int n, void* out, int64_t count, ReduceElem elem, ReduceOp op,
                   void* stream) {
  if (n < 1 || n > kMaxReduceInputs) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  Inputs in{};
  for (int r = 0; r < n; ++r) in.at[r] = inputs[r];
  switch (elem) {
    case ReduceElem::F32: return launch_as<float>(in, n, out, count, op, stream);
    case ReduceElem::F64: return launch_as<double>(in, n, out, count, op, stream);
    case ReduceElem::F16: return launch_as<__half>(in, n, out, count, op, stream);
    case ReduceElem::BF16: return launch_as<__nv_bfloat16>(in, n, out, count, op, stream);
    case ReduceElem::I64: return launch_as<long long>(in, n, out, count, op, stream);
    case ReduceElem::I32: return launch_as<int>(in, n, out, count, op, stream);
    case ReduceElem::I8: return launch_as<signed char>(in, n, out, count, op, stream);
    case ReduceElem::U8: return launch_as<unsigned char>(in, n, out, count, op, stream);
    case ReduceElem::Bool: return launch_as<bool>(in, n, out, count, op, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace shardwise::cuda::launch
