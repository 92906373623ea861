#pragma once
// Reference CPU kernels of the unary elementwise ops, forward and backward.
//
// Floats (f32, f64, f16, bf16) compute in compute_t<T> (float for the 16-bit types). Integer
// dtypes are supported by abs, neg, sign, square (two's-complement wraparound, like PyTorch: so
// abs/neg of the most negative value is itself) and by scale and cast; bool only by cast.
// Gradients follow PyTorch at non-differentiable points: abs'(0) = 0, relu'(0) = 0, sign' = 0.
// An integer or bool input has no gradient: the backward kernels return an undefined Tensor.
#include <cstdint>
#include <string_view>

#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

enum class UnaryOp : uint8_t {
  Abs,
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Sin,
  Cos,
  Tanh,
  Sigmoid,
  Relu,
  Gelu,  // tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  Silu,
  Square,
  Sign,
};

inline constexpr UnaryOp kAllUnaryOps[] = {
    UnaryOp::Abs,  UnaryOp::Neg,     UnaryOp::Exp,  UnaryOp::Log,  UnaryOp::Sqrt,   UnaryOp::Rsqrt,
    UnaryOp::Reciprocal, UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu,
    UnaryOp::Gelu, UnaryOp::Silu,    UnaryOp::Square, UnaryOp::Sign};

std::string_view unary_op_name(UnaryOp op);  // "abs", "neg", ... (the op registry names)
// True when `op` accepts inputs of `dtype` (floats always; integers for abs, neg, square, sign).
bool unary_supports(UnaryOp op, DType dtype);
// Error naming the op and the accepted dtypes unless unary_supports(op, dtype).
void check_unary_dtype(UnaryOp op, DType dtype);

// out = f(x), same shape and dtype.
Tensor unary(UnaryOp op, const Tensor& x);
// dx = dy * f'(x). `out` is f(x) (some derivatives are computed from it, like PyTorch does:
// exp, sqrt, rsqrt, reciprocal, tanh, sigmoid). Neg and sign read neither x nor out (only dy's
// shape and dtype), so x and out may be given with any shape for them. Undefined for integer x.
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& out, const Tensor& dy);

// PaddlePaddle's scale: out = scale * x + bias, or scale * (x + bias) when !bias_after_scale.
// Floats compute in compute_t<T>; integer tensors need whole-number scale and bias (Error
// otherwise) and wrap around like integer arithmetic; bool is rejected.
Tensor scale(const Tensor& x, double scale, double bias, bool bias_after_scale);
void check_scale_args(DType dtype, double scale, double bias);
// dx = scale * dy (the bias does not matter); undefined for an integer dy.
Tensor scale_backward(const Tensor& dy, double scale);

// Converts to `dtype`, for every pair of dtypes:
//  - to bool: x != 0 (NaN is true);
//  - float to integer: truncation toward zero, saturated to the target's range, NaN -> 0;
//  - integer to integer: two's-complement wraparound (C++20 conversion);
//  - to a float: nearest value (16-bit floats round from float).
Tensor cast(const Tensor& x, DType dtype);
// dx = dy cast back to the input dtype; undefined when the input dtype is not floating.
Tensor cast_backward(const Tensor& dy, DType input_dtype);

}  // namespace shardwise::ops
