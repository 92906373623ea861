#pragma once
// ops::matmul_forward / matmul_grads on device tensors through cuBLASLt (cuda/blas.h): the same
// forms (trans_x, trans_y, 1-D operands, batch dims broadcast NumPy-style, a batch folded into m
// when y has none), f32 or bf16 (bf16 in and out, f32 accumulation), the output in x's dtype.
// A batch whose operands are each whole or one matrix for every item is one strided-batched GEMM;
// any other broadcast runs one GEMM per output item. Gradients of a broadcast operand accumulate
// over its items in a fixed order (beta = 1 after the first): deterministic.
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

struct MatmulOptions {
  bool trans_x = false, trans_y = false;
  bool tf32 = false;  // f32 only; off by default (the results then match the CPU's to f32 rounding)
};

Tensor matmul(const Tensor& x, const Tensor& y, const MatmulOptions& options = {}, Stream stream = {});

struct MatmulGrads {
  Tensor dx, dy;  // undefined where not wanted
};
MatmulGrads matmul_backward(const Tensor& x, const Tensor& y, const Tensor& dout, const MatmulOptions& options = {},
                            bool want_dx = true, bool want_dy = true, Stream stream = {});

}  // namespace shardwise::cuda
