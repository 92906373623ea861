// The unary elementwise ops and their gradients (as ops/unary: dx from x or from out = f(x), the
// same formula), SwiGLU (ops/activation), scale, casts between f32 / bf16 / f16, and fill: grid-stride loops in float.
#include <cstdint>

#include "shardwise/cuda/common/activation.cuh"
#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/walk.cuh"

namespace shardwise::cuda::launch {

namespace {

using namespace detail;

__device__ float apply(Unary op, float v) {
  switch (op) {
    case Unary::Neg: return -v;
    case Unary::Exp: return expf(v);
    case Unary::Log: return logf(v);
    case Unary::Sqrt: return sqrtf(v);
    case Unary::Rsqrt: return 1.0f / sqrtf(v);
    case Unary::Reciprocal: return 1.0f / v;
    case Unary::Tanh: return tanhf(v);
    case Unary::Sigmoid: return sigmoid(v);
    case Unary::Relu: return v < 0.0f ? 0.0f : v;
    case Unary::Square: return v * v;
    case Unary::Abs: return fabsf(v);
    case Unary::Gelu: return gelu(v);
    case Unary::Silu: return silu(v);
  }
  return 0.0f;
}

__device__ float sign_of(float v) { return v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : v; }

__device__ float grad(Unary op, float v, float o, float g) {
  switch (op) {
    case Unary::Neg: return -g;
    case Unary::Exp: return g * o;
    case Unary::Log: return g / v;
    case Unary::Sqrt: return g / (2.0f * o);
    case Unary::Rsqrt: return g * (-0.5f * o * o * o);
    case Unary::Reciprocal: return g * -(o * o);
    case Unary::Tanh: return g * (1.0f - o * o);
    case Unary::Sigmoid: return g * (o * (1.0f - o));
    case Unary::Relu: return v > 0.0f ? g : 0.0f;
    case Unary::Square: return g * (2.0f * v);
    case Unary::Abs: return g * sign_of(v);
    case Unary::Gelu: return g * gelu_grad(v);
    case Unary::Silu: return g * silu_grad(v);
  }
  return 0.0f;
}

template <class T>
__global__ void forward_kernel(Unary op, const T* x, T* y, long long n) {
  for (long long i = first_index(); i < n; i += grid_step()) y[i] = from_f<T>(apply(op, to_f(x[i])));
}

template <class T>
__global__ void backward_kernel(Unary op, const T* x, const T* out, const T* dy, T* dx, long long n) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const float v = x != nullptr ? to_f(x[i]) : 0.0f, o = out != nullptr ? to_f(out[i]) : 0.0f;
    dx[i] = from_f<T>(grad(op, v, o, to_f(dy[i])));
  }
}

template <class T>
__global__ void swiglu_kernel(const T* gate, const T* up, T* out, long long n) {
  for (long long i = first_index(); i < n; i += grid_step()) out[i] = from_f<T>(silu(to_f(gate[i])) * to_f(up[i]));
}

template <class T>
__global__ void swiglu_grad_kernel(const T* gate, const T* up, const T* dout, T* dgate, T* dup, long long n) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const float g = to_f(gate[i]), d = to_f(dout[i]);
    dgate[i] = from_f<T>(d * to_f(up[i]) * silu_grad(g));
    dup[i] = from_f<T>(d * silu(g));
  }
}

template <class T>
__global__ void scale_kernel(const T* x, T* y, long long n, float scale, float bias, bool after) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const float v = to_f(x[i]);
    // No contraction into an FMA: the CPU's -ffp-contract=off rounds the product first.
    y[i] = from_f<T>(after ? __fadd_rn(__fmul_rn(scale, v), bias) : __fmul_rn(scale, __fadd_rn(v, bias)));
  }
}

template <class From, class To>
__global__ void cast_kernel(const From* x, To* y, long long n) {
  for (long long i = first_index(); i < n; i += grid_step()) y[i] = from_f<To>(to_f(x[i]));
}

template <class T>
__global__ void fill_kernel(T value, T* out, long long n) {
  for (long long i = first_index(); i < n; i += grid_step()) out[i] = value;
}

cudaStream_t raw(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

int unary_forward(Unary op, Elem t, const void* x, void* out, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    forward_kernel<T><<<grid_for(n), kBlock, 0, raw(s)>>>(op, static_cast<const T*>(x), static_cast<T*>(out), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int unary_backward(Unary op, Elem t, const void* x, const void* out, const void* dy, void* dx, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    backward_kernel<T><<<grid_for(n), kBlock, 0, raw(s)>>>(op, static_cast<const T*>(x), static_cast<const T*>(out),
                                                           static_cast<const T*>(dy), static_cast<T*>(dx), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int swiglu_forward(Elem t, const void* gate, const void* up, void* out, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    swiglu_kernel<T><<<grid_for(n), kBlock, 0, raw(s)>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                         static_cast<T*>(out), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int swiglu_backward(Elem t, const void* gate, const void* up, const void* dout, void* dgate, void* dup, int64_t n,
                    void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    swiglu_grad_kernel<T><<<grid_for(n), kBlock, 0, raw(s)>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                              static_cast<const T*>(dout), static_cast<T*>(dgate),
                                                              static_cast<T*>(dup), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int scale(Elem t, const void* x, void* out, int64_t n, float scale, float bias, bool bias_after_scale, void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    scale_kernel<T><<<grid_for(n), kBlock, 0, raw(s)>>>(static_cast<const T*>(x), static_cast<T*>(out), n, scale, bias,
                                                        bias_after_scale);
    return static_cast<int>(cudaGetLastError());
  });
}

int cast(Elem from, Elem to, const void* x, void* out, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(from, [&](auto a) {
    return with_elem(to, [&](auto b) {
      using From = decltype(a);
      using To = decltype(b);
      cast_kernel<From, To><<<grid_for(n), kBlock, 0, raw(s)>>>(static_cast<const From*>(x), static_cast<To*>(out), n);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int fill(int bytes, uint64_t bits, void* out, int64_t n, void* s) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n);
  switch (bytes) {
    case 1: fill_kernel<uint8_t><<<grid, kBlock, 0, raw(s)>>>(static_cast<uint8_t>(bits), static_cast<uint8_t*>(out), n); break;
    case 2: fill_kernel<uint16_t><<<grid, kBlock, 0, raw(s)>>>(static_cast<uint16_t>(bits), static_cast<uint16_t*>(out), n); break;
    case 4: fill_kernel<uint32_t><<<grid, kBlock, 0, raw(s)>>>(static_cast<uint32_t>(bits), static_cast<uint32_t*>(out), n); break;
    case 8: fill_kernel<uint64_t><<<grid, kBlock, 0, raw(s)>>>(bits, static_cast<uint64_t*>(out), n); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
