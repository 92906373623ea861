#pragma once
// The fused causal attention on device tensors (attention_forward.cu, attention_backward.cu): the
// CUDA twin of ops::flash_attention / flash_attention_backward (ops/attention/kernels.h) on one
// device: q [B, H, S, D] with k, v [B, H, S, D], or grouped-query q [B, G, R, S, D] with k, v
// [B, G, S, D]; key j visible to query i iff j <= i and, with document ids doc [B, S] (i64, or an
// undefined tensor), doc[b, j] == doc[b, i]. f32, or bf16 with f32 accumulation; lse f32 of q's
// shape without D; D <= 128. Not here (yet): attention dropout, context-parallel blocks (the
// CPU op's AttentionCoords), f64 and f16: the caller keeps those on the CPU kernel.
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

struct AttentionResult {
  Tensor out, lse;
};
AttentionResult flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc, double scale,
                                Stream stream = {});

struct AttentionGradResult {
  Tensor dq, dk, dv;
};
AttentionGradResult flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                             const Tensor& out, const Tensor& lse, const Tensor& dout, double scale,
                                             Stream stream = {});

}  // namespace shardwise::cuda
