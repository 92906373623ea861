#pragma once
// ops::lm_head_cross_entropy_outputs on device tensors: loss(h, W, labels) = cross_entropy(h Wᵀ,
// labels) without the [N, V] logits existing whole. Rows run in chunks of chunk_bytes / (classes
// * element size) rows (from the GLOBAL vocabulary, as the CPU op, so every rank of a vocab-parallel group runs
// the same chunks): each chunk's f32 logits are one cuBLASLt GEMM, reduced to the row max, then the
// sum of exponentials and the target logit (combined across the vocab blocks by the caller's
// `combine` between the two steps when there is one), then the loss; with `grads` the chunk becomes
// its dlogits in place and two GEMMs form dh_c = dlogits W and dW += dlogitsᵀ h_c right there, for
// dloss = grad_scale (reduction sum or mean). bf16 h and W (--compute bf16) stay bf16: the three
// GEMMs are cuBLASLt bf16 GEMMs with f32 compute writing f32 (the logits from bf16 h and W, the
// gradients from the chunk's dlogits rounded to bf16), the loss is f32 and dh, dW are rounded to
// bf16 once at the end: the CPU op's rounding points (ops/softmax/lm_head.h).
#include <functional>

#include "shardwise/cuda/common/launchers.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

struct LmHeadOptions {
  int64_t ignore_index = -100;
  launch::Reduction reduction = launch::Reduction::Mean;
  int64_t classes = -1;  // the global vocabulary (-1: W's rows); W holds [offset, offset + W rows)
  int64_t offset = 0;
  int64_t chunk_bytes = int64_t{64} << 20;
  bool grads = false;  // form dh and dW in the forward (reduction sum or mean only)
  double grad_scale = 1.0;
  bool tf32 = false;
  // The caller's collective over the ranks holding the other vocab blocks of the same rows: an
  // all-reduce (max when `is_max`, else sum) of an f64 device tensor in place. Empty: no group.
  std::function<void(Tensor& stats, bool is_max)> combine;
};

struct LmHeadResult {
  Tensor loss, dh, dw;  // dh, dw only with `grads`
};
// h [..., H], W [V_local, H] (f32 or bf16, one dtype), labels [...] i64; the loss f32, dh and dW
// in h's dtype.
LmHeadResult lm_head_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels,
                                   const LmHeadOptions& options, Stream stream = {});

// The vocab-parallel pieces on one block of f32 logits [rows, cols] holding the classes
// [offset, offset + cols): the row max (f64), and given the GLOBAL row max the sum of exponentials
// and the target logit (f64; 0 where the label is elsewhere or ignored).
Tensor vocab_row_max(const Tensor& logits, Stream stream = {});
struct VocabRowSums {
  Tensor sum_exp, target;
};
VocabRowSums vocab_row_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, int64_t offset,
                            int64_t ignore_index, Stream stream = {});

}  // namespace shardwise::cuda
