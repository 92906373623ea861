#pragma once
// Elementwise kernels on device tensors of f32, bf16 or f16 (computing in float), each the CUDA
// twin of a CPU kernel: ops::binary / binary_backward (broadcasting; the gradients summed back to
// each operand's shape like reduce_to_shape), ops::unary / unary_backward, ops::scale, ops::cast
// between the floating dtypes, and a fill. Outputs come from the device allocator on `stream`.
#include "shardwise/cuda/common/tensor_launchers.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

using launch::Binary;
using launch::Unary;

Tensor binary(Binary op, const Tensor& x, const Tensor& y, Stream stream = {});
struct BinaryGrads {
  Tensor dx, dy;
};
BinaryGrads binary_backward(Binary op, const Tensor& x, const Tensor& y, const Tensor& dout, Stream stream = {});

Tensor unary(Unary op, const Tensor& x, Stream stream = {});
// dx = dy * f'(x); `out` = f(x) (the derivative of exp, sqrt, rsqrt, reciprocal, tanh and sigmoid
// is read from it, as the CPU kernel does).
Tensor unary_backward(Unary op, const Tensor& x, const Tensor& out, const Tensor& dy, Stream stream = {});

// ops::swiglu / swiglu_backward: silu(gate) * up (Llama's MLP), gate and up of one shape and dtype.
Tensor swiglu(const Tensor& gate, const Tensor& up, Stream stream = {});
struct SwigluGrads {
  Tensor dgate, dup;
};
SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Stream stream = {});

// scale * x + bias (bias_after_scale) or scale * (x + bias); its gradient is scale(dy, s, 0).
Tensor scale(const Tensor& x, double scale, double bias, bool bias_after_scale, Stream stream = {});
// x converted to `dtype` (f32, bf16, f16: the nearest value).
Tensor cast(const Tensor& x, DType dtype, Stream stream = {});
// A tensor of `value` (f32, bf16, f16, i64, i32).
Tensor full(DType dtype, const Shape& shape, double value, Device device, Stream stream = {});

}  // namespace shardwise::cuda
