#pragma once
// CUDA kernels on device tensors (tensor/device_copy.h), f32 (the norms also bf16), each the CUDA
// twin of a CPU kernel: the same function, compared against it on random inputs by tests/cuda (run
// only on a GPU machine: docs/gpu.md says which have run). Outputs come from the device allocator on
// `stream`; the launches are asynchronous on it. Every input must be a tensor of the dtype named on
// one device (i64 labels), else an Error naming the kernel and the argument. The elementwise family
// (bf16 GELU / SiLU among it) is in elementwise.h, GEMMs in matmul.h, the LM head in lm_head.h, the
// fused attention in attention.h, MoE in moe.h.
#include <cstdint>

#include "shardwise/cuda/common/launchers.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

using launch::Activation;
using launch::Reduction;

// ops::unary(Gelu / Silu, x) and ops::unary_backward's dx = dy * f'(x).
Tensor activation(Activation op, const Tensor& x, Stream stream = {});
Tensor activation_backward(Activation op, const Tensor& x, const Tensor& dy, Stream stream = {});

// train::AdamW::update on device tensors, in place (w: master weights, m, v: moments, g: gradient).
struct AdamWArgs {
  double beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1, lr = 1e-3;
  int64_t step = 1;
  bool decay = true;
};
// bf16_param (optional): a bf16 parameter whose f32 master is w gets w rounded to bf16 (what
// train::AdamW::step does with p.master.to(bf16)), in the same kernel.
void adamw_update(Tensor& w, Tensor& m, Tensor& v, const Tensor& g, const AdamWArgs& args, Stream stream = {},
                  Tensor* bf16_param = nullptr);

// ops::layer_norm / rms_norm over the last dim (begin_norm_axis -1) and their backward, f32 or bf16
// (x, the parameters, the output and the gradients of one dtype; math in double); the statistics
// are f32 of x's leading shape.
struct LayerNormResult {
  Tensor out, mean, rstd;
};
LayerNormResult layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, double epsilon,
                           Stream stream = {});
struct LayerNormGradResult {
  Tensor dx, dscale, dbias;
};
LayerNormGradResult layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dout, Stream stream = {});
struct RmsNormResult {
  Tensor out, inv_rms;
};
RmsNormResult rms_norm(const Tensor& x, const Tensor& scale, double epsilon, Stream stream = {});
struct RmsNormGradResult {
  Tensor dx, dscale;
};
RmsNormGradResult rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dout,
                                    Stream stream = {});

// ops::softmax(x, -1) and ops::softmax_backward(out, dout, -1), f32 or bf16 (f32 math; dout of
// out's dtype).
Tensor softmax(const Tensor& x, Stream stream = {});
Tensor softmax_backward(const Tensor& out, const Tensor& dout, Stream stream = {});

// ops::cross_entropy / cross_entropy_backward over the last dim, i64 labels. A label outside
// [0, C) that is not ignore_index is an Error naming its row: the forward reads one flag back to
// the host for that (a synchronisation of `stream`).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, Reduction reduction,
                     Stream stream = {});
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss, int64_t ignore_index,
                              Reduction reduction, Stream stream = {});

// ops::rotary_embedding / rotary_embedding_backward (ops/rotary/kernels.h's layout and angles):
// x f32 or bf16 [..., S, D], D even; positions i64 or i32, [S] or [x's dim 0, S]. The backward
// rotates dout back.
Tensor rotary_embedding(const Tensor& x, const Tensor& positions, double theta, Stream stream = {});
Tensor rotary_embedding_backward(const Tensor& dout, const Tensor& positions, double theta, Stream stream = {});

// ops::embedding / embedding_backward: weight (f32 or bf16; the gradient of dout's dtype, f32 or
// bf16, summed in f32 and rounded once: the CPU's bf16 gradient rounds after each add) is the block of rows
// [vocab_offset, vocab_offset + rows) of a vocab of vocab_size (one device: 0 and its rows); ids
// i64 or i32 of any shape. An id outside [0, vocab_size) is an Error naming it and its position
// (one flag read back: a synchronisation of `stream`); an id outside the block gives a zero row and
// takes no gradient. The gradient adds duplicates in position order, as the CPU does: the same bits.
Tensor embedding(const Tensor& ids, const Tensor& weight, int64_t vocab_offset, int64_t vocab_size, Stream stream = {});
Tensor embedding_backward(const Tensor& ids, const Tensor& dout, const Shape& weight_shape, int64_t vocab_offset,
                          int64_t vocab_size, Stream stream = {});

}  // namespace shardwise::cuda
