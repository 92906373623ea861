#include "shardwise/ops/activation/kernels.h"

#include <cmath>

#include "shardwise/core/error.h"
#include "shardwise/ops/sigmoid.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

namespace {

template <class T>
void swiglu_typed(const T* g, const T* u, T* o, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    const C v = static_cast<C>(g[i]);
    o[i] = static_cast<T>(v * sigmoid_of(v) * static_cast<C>(u[i]));
  }
}

template <class T>
void swiglu_backward_typed(const T* g, const T* u, const T* d, T* dg, T* du, int64_t n) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    const C v = static_cast<C>(g[i]), s = sigmoid_of(v), dy = static_cast<C>(d[i]);
    dg[i] = static_cast<T>(dy * static_cast<C>(u[i]) * (s * (C(1) + v * (C(1) - s))));
    du[i] = static_cast<T>(dy * (v * s));
  }
}

// Calls fn(T{}) with T the C++ type of a floating dtype (checked by check_swiglu_inputs).
template <class F>
void float_dispatch(DType dtype, F&& fn) {
  switch (dtype) {
    case DType::F32: return fn(float{});
    case DType::F64: return fn(double{});
    case DType::F16: return fn(f16{});
    case DType::BF16: return fn(bf16{});
    default: fail("swiglu: {} is not a floating dtype", dtype_name(dtype));
  }
}

}  // namespace

void check_swiglu_inputs(const Shape& gate, DType gate_dtype, const Shape& up, DType up_dtype) {
  SW_CHECK(gate == up, "swiglu: gate {} and up {} must have the same shape", gate.to_string(), up.to_string());
  SW_CHECK(gate_dtype == up_dtype && is_floating(gate_dtype),
           "swiglu: gate ({}) and up ({}) must have the same floating dtype (f32, f64, f16, bf16)",
           dtype_name(gate_dtype), dtype_name(up_dtype));
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  check_swiglu_inputs(gate.shape(), gate.dtype(), up.shape(), up.dtype());
  Tensor out = Tensor::uninitialized(gate.dtype(), gate.shape());
  float_dispatch(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    T* o = out.data<T>();
    parallel_for(out.numel(), kParallelGrain, [&](int64_t b, int64_t e) { swiglu_typed(g + b, u + b, o + b, e - b); });
  });
  return out;
}

SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout) {
  check_swiglu_inputs(gate.shape(), gate.dtype(), up.shape(), up.dtype());
  SW_CHECK(dout.shape() == gate.shape() && dout.dtype() == gate.dtype(),
           "swiglu backward: dout must be {} {} like the output, got {} {}", dtype_name(gate.dtype()),
           gate.shape().to_string(), dtype_name(dout.dtype()), dout.shape().to_string());
  SwigluGrads grads{Tensor::uninitialized(gate.dtype(), gate.shape()), Tensor::uninitialized(gate.dtype(), gate.shape())};
  float_dispatch(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    const T* d = dout.data<T>();
    T* dg = grads.dgate.data<T>();
    T* du = grads.dup.data<T>();
    parallel_for(gate.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
      swiglu_backward_typed(g + b, u + b, d + b, dg + b, du + b, e - b);
    });
  });
  return grads;
}

}  // namespace shardwise::ops
