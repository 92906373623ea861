#pragma once
// The matmul kernels (PaddlePaddle / NumPy matmul with broadcast batch dims and 1-D operands) and
// their shape algebra, shared with the rule (rules.cc) and the registry entry (ops.cc).
#include <span>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/core/shape.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// The shapes of matmul(x, y) with PaddlePaddle / NumPy semantics: x is [..., m, k] ([..., k, m]
// when trans_x), y is [..., k, n] ([..., n, k] when trans_y); a 1-D x is a row vector [k] (m = 1,
// dropped from the output), a 1-D y a column vector [k] (n = 1, dropped); trans flags are ignored
// for 1-D operands. Batch dims broadcast NumPy-style (right-aligned, size 1 stretches).
struct MatmulDims {
  int64_t m = 1, k = 0, n = 1;
  bool x_vector = false, y_vector = false;  // 1-D operands
  bool trans_x = false, trans_y = false;    // effective flags (false for 1-D operands)
  int x_batch_ndim = 0, y_batch_ndim = 0;
  Shape batch;  // broadcast batch shape of the output
  Shape out;    // output shape: batch ++ [m unless x_vector] ++ [n unless y_vector]
  int64_t x_matrix() const { return m * k; }  // elements of one x / y / out matrix
  int64_t y_matrix() const { return k * n; }
  int64_t out_matrix() const { return m * n; }
};

// Error (naming both shapes) when a rank is 0, k differs or the batch dims do not broadcast.
MatmulDims matmul_dims(const Shape& x, const Shape& y, bool trans_x, bool trans_y);

// matmul_dims after checking the dtypes (equal, supported by the GEMM) and reading trans_x/trans_y.
MatmulDims matmul_checked_dims(const Shape& x, DType xt, const Shape& y, DType yt, const Attrs& attrs);

// out = op(x) op(y): one GEMM per output batch item (the batch folded into m when y has none).
std::vector<Tensor> matmul_forward(std::span<const Tensor> in, const Attrs& attrs);

// dx = dout * op(y)^T and dy = op(x)^T * dout, written in each input's stored layout (transposed
// when its trans flag is set). The first product into a matrix of dx / dy has beta = 0, later ones
// beta = 1: they accumulate the sum over the batch items an input was broadcast to. want_dx /
// want_dy leave a gradient undefined (a zero-bubble schedule computes them at different times).
std::vector<Tensor> matmul_grads(std::span<const Tensor> in, std::span<const Tensor> out_grads, const Attrs& attrs,
                                 bool want_dx, bool want_dy);

}  // namespace shardwise::ops
