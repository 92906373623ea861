#pragma once
// The fused causal attention on device tensors (attention_forward.cu, attention_backward.cu): the
// CUDA twin of ops::flash_attention / flash_attention_backward (ops/attention/kernels.h) on one
// device: q [B, H, S, D] with k, v [B, H, S, D], or grouped-query q [B, G, R, S, D] with k, v
// [B, G, S, D]; key j visible to query i iff j <= i and, with document ids doc [B, S] (i64, or an
// undefined tensor), doc[b, j] == doc[b, i]. f32, or bf16 with f32 accumulation; lse f32 of q's
// shape without D; D <= 128. bf16 with head dim 64 or 128 runs on tensor cores (wmma, f32
// accumulation: attention_mma_*.cu), everything else on float FMAs; `path` forces one (the tests
// compare them; TensorCore where it does not apply is an Error naming why). Not here (yet): attention dropout, context-parallel blocks (the
// CPU op's AttentionCoords), f64 and f16: the caller keeps those on the CPU kernel.
#include "shardwise/cuda/common/launchers.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

struct AttentionResult {
  Tensor out, lse;
};
using launch::AttentionPath;

AttentionResult flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc, double scale,
                                Stream stream = {}, AttentionPath path = AttentionPath::Auto);

struct AttentionGradResult {
  Tensor dq, dk, dv;
};
AttentionGradResult flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                             const Tensor& out, const Tensor& lse, const Tensor& dout, double scale,
                                             Stream stream = {}, AttentionPath path = AttentionPath::Auto);

}  // namespace shardwise::cuda
