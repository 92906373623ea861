#pragma once
// The fused LM head + cross-entropy: loss(h, W, labels) = cross_entropy(h · Wᵀ, labels) without the
// [N, V] logits ever existing whole.
//
//   h [..., H] (the final hidden states; rows are the positions of labels), W [V_local, H] (the
//   head's weight, or this rank's block of its vocabulary rows [offset, offset + V_local) of
//   `shard.classes`), labels [...] i64 / i32 global class ids; ignore_index and reduction as
//   cross_entropy (kernels.h). The rows run in chunks of `chunk_rows` (from the byte budget and the
//   GLOBAL vocabulary, so every rank of a vocab-parallel group runs the same chunks): each chunk's
//   logits h_c · Wᵀ are one GEMM into a buffer of about `chunk_bytes`, reduced to the row max, the
//   sum of exponentials and the target logit by the same row functions cross_entropy uses
//   (cross_entropy_local_max / _local_sums), all-reduced over `group` (the ranks holding the other
//   vocab blocks of the same rows: max, then sum) when there is one, and dropped. The loss is
//   cross_entropy_from_rows of the gathered row statistics: the unfused pair's formula.
//
//   Gradients in the forward (`forward_grads`, the training graph's head): the loss is terminal, so
//   with reduction "sum" or "mean" its gradient is dloss times a fixed tensor. The forward then
//   also forms each chunk's dlogits = (softmax - onehot) * w in the logits' own buffer (the
//   exponentials kept from the row sums: cross_entropy_local_sums_to_exp, cross_entropy_grad_in_place)
//   with w = grad_scale (/ count for "mean"), and runs dh_c = dlogits · W and dW += dlogitsᵀ · h_c
//   right there: three GEMMs per step instead of four, no chunk recomputed. dh and dW are extra
//   outputs (bit 1: dh, bit 2: dW); the backward returns them as they are when dloss equals
//   grad_scale in the compute dtype (the graph's 1 / (B·S): no copy), else times dloss / grad_scale.
//
//   backward without them: per chunk, the logits are recomputed (one GEMM), the row statistics with
//   them, dlogits = (softmax - onehot) * w formed in the chunk (cross_entropy_backward_from_rows),
//   then dh_c = dlogits · W and dW += dlogitsᵀ · h_c (two GEMMs). Under vocab parallelism dh is this
//   block's part (the rule makes it Partial(sum)); dW is the local block.
//
//   f16 / bf16 h and W (`--compute bf16`: the head's GEMMs on half operands, f32 accumulation) are
//   widened to f32 and run the f32 chunks: each chunk's logits h_c · Wᵀ are f32 products of the half
//   values (not rounded to the half type), the softmax and the loss f32, and the loss is f32
//   (lm_head_loss_dtype; dloss too), as autocast's cross-entropy. Each chunk's dlogits are rounded to
//   the half type before the two gradient GEMMs (the operand a half-type GEMM reads: autocast's
//   matmul backward, cuBLASLt's bf16 GEMM on CUDA), whose f32 sums dh and dW are rounded once to
//   h's dtype at the end.
#include <array>
#include <cstdint>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/ops/softmax/kernels.h"

namespace shardwise::ops {

// The default budget of one chunk's logits (64 MiB: 333 rows of f32 logits at V = 50 257). Each
// chunk's GEMMs repack the whole weight and the dW GEMM reads and writes all of dW, so small chunks
// cost time: the head alone at the GPT-2 small shape took 4.5x (4 MiB), 2.3x (16 MiB) and 1.5x
// (64 MiB) the unfused pair's time with the recomputing backward, and about the pair's time at 64
// MiB with the gradients formed in the forward (bench/bench_lm_head.cc, BENCHMARKS.md).
inline constexpr int64_t kLmHeadChunkBytes = int64_t{64} << 20;

struct LmHeadArgs {
  int64_t ignore_index = -100;
  LossReduction reduction = LossReduction::Mean;
  ClassShard shard;                       // W's vocab block ({-1, 0}: W holds every class)
  comm::Communicator* group = nullptr;    // the ranks holding the other vocab blocks; null: none
  int64_t chunk_bytes = kLmHeadChunkBytes;  // > 0
  int forward_grads = 0;   // bits: 1 dh, 2 dW computed in the forward (extra outputs, in that order)
  double grad_scale = 1.0;  // the dloss the forward's gradients are formed for
};
inline constexpr int kLmHeadGradH = 1, kLmHeadGradW = 2;

// Attributes: "ignore_index", "reduction" as cross_entropy, "chunk_bytes" (default
// kLmHeadChunkBytes; Error naming `op` unless > 0), "forward_grads" (0-3, default 0; nonzero
// needs reduction "sum" or "mean": with "none" the loss gradient is not one number), "grad_scale"
// (default 1; finite, nonzero). Errors name `op`.
LmHeadArgs lm_head_args(const Attrs& attrs, std::string_view op);
// The op's outputs: loss, then dh and dW where forward_grads asks for them.
int lm_head_num_outputs(const LmHeadArgs& args);
// The loss's dtype: f32 for f16 / bf16 h (the dtype the head computes in), else h's.
DType lm_head_loss_dtype(DType h_dtype);

// Rows per chunk: chunk_bytes / (classes * element size), at least 1.
int64_t lm_head_chunk_rows(int64_t classes, DType dtype, int64_t chunk_bytes);

// Error naming the op unless h is floating with rank >= 1, W is [V, H] of h's dtype and labels
// are h's shape without its last dim (i64 / i32).
void check_lm_head_args(const Shape& h, DType h_dtype, const Shape& w, DType w_dtype, const Shape& labels,
                        DType labels_dtype);

// The loss (forward_grads ignored).
Tensor lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels, const LmHeadArgs& args);
// The op's outputs: {loss, dh if forward_grads & 1, dW if forward_grads & 2}, dh and dW in h's dtype
// for dloss = grad_scale.
std::vector<Tensor> lm_head_cross_entropy_outputs(const Tensor& h, const Tensor& w, const Tensor& labels,
                                                  const LmHeadArgs& args);
// {dh, dW}; dloss has cross_entropy_loss_shape and the loss's dtype (lm_head_loss_dtype). want[0] / want[1] false: that
// gradient is left undefined and its GEMM skipped (a frozen head weight, zero-bubble's split).
// `saved`: the forward's extra outputs ({dh, dW}, undefined where not computed): a wanted gradient
// found there is returned scaled by dloss / grad_scale (as is when they are equal); the others are
// recomputed chunk by chunk.
std::array<Tensor, 2> lm_head_cross_entropy_backward(const Tensor& h, const Tensor& w, const Tensor& labels,
                                                     const Tensor& dloss, const LmHeadArgs& args,
                                                     std::array<bool, 2> want = {true, true},
                                                     const std::array<Tensor, 2>& saved = {});

}  // namespace shardwise::ops
