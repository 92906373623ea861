#pragma once
// Reference CPU kernels of the broadcasting binary elementwise ops and of where(cond, x, y),
// forward and backward. Operands broadcast like NumPy (tensor/broadcast.h) and must share a dtype.
#include <cstdint>
#include <string_view>

#include "shardwise/core/dtype.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

enum class BinaryOp : uint8_t {
  Add, Subtract, Multiply, Divide,
  Maximum, Minimum,  // NaN propagates (numpy.maximum / minimum)
  Fmax, Fmin,        // NaN is ignored unless both are NaN (numpy.fmax / fmin)
  Atan2,             // atan2(x, y): the angle of the point (y, x), as numpy.arctan2
  Pow,               // x ** y
  BitwiseAnd, BitwiseOr, BitwiseXor,  // integer dtypes and bool only
};

std::string_view binary_op_name(BinaryOp op);  // "add", "bitwise_and", ...
bool binary_op_has_gradient(BinaryOp op);      // false for the bitwise ops

// Which dtypes an op accepts:
//  add, subtract, multiply, maximum, minimum, fmax, fmin: floating and integer dtypes;
//  divide, atan2, pow: floating dtypes;  bitwise_*: integer dtypes and bool.
// Integer add/subtract/multiply wrap around on overflow (two's complement), never UB.
bool binary_op_supports(BinaryOp op, DType dtype);
// Error naming the op and both dtypes unless they are equal and supported; returns the result dtype.
DType binary_result_dtype(BinaryOp op, DType x, DType y);
// Error unless cond is bool and x, y share a dtype; returns the result dtype (x's).
DType where_result_dtype(DType cond, DType x, DType y);

// out = op(x, y) broadcast.
Tensor binary(BinaryOp op, const Tensor& x, const Tensor& y);

struct BinaryGrads {
  Tensor dx, dy;
};
// Gradients of x and y given dout (of out's shape), each summed back to its operand's shape
// (reduce_to_shape). Floating dtypes only: integer tensors take no gradient (both undefined).
// maximum/minimum (and fmax/fmin) route the gradient to the selected operand; on a tie it is
// split half/half between x and y (PyTorch's convention), and a NaN operand that propagates
// takes it all. pow: dy is 0 where x == 0 and y >= 0 (PyTorch), and dx is 0 where y == 0.
BinaryGrads binary_backward(BinaryOp op, const Tensor& x, const Tensor& y, const Tensor& out, const Tensor& dout);

// out = cond ? x : y, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y);
// dx = dout where cond (0 elsewhere), dy = dout where !cond, each summed back to its operand's
// shape; cond takes no gradient. Undefined for non-floating dtypes.
BinaryGrads where_backward(const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& dout);

}  // namespace shardwise::ops
