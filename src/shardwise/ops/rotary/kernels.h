#pragma once
// Kernels of rotary position embeddings (RoPE, Su et al.; Llama's `apply_rotary_pos_emb` with
// transformers' `rotate_half` convention). x is [..., S, D] (D even: the head dim), positions [S]
// integers: the position of each row of dim -2, or [B, S] with B = x's dim 0 (x at least 3-d): each
// batch row its own positions (packed documents restart them per sequence). With h = D / 2 and, for i < h,
//   inv_freq[i] = 1 / theta^(2i / D),  a = positions[s] * inv_freq[i],
//   (a = positions[b, s] * inv_freq[i] for x[b, .., s, :] with [B, S] positions)
//   out[.., s, i]     = x[.., s, i] cos a - x[.., s, i + h] sin a
//   out[.., s, i + h] = x[.., s, i + h] cos a + x[.., s, i] sin a
// i.e. out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[h:], x[:h]). The gradient is
// the inverse rotation of dout (a rotation's transpose). Angles are computed in the compute type:
// float for f32 / f16 / bf16 (as transformers computes inv_freq, the angles and cos / sin in
// float32), double for f64. Positions are global (a shard of the sequence passes its own rows'
// positions), so the op needs no context.
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

constexpr double kRopeTheta = 10000.0;

// Error naming the op unless x is a floating [..., S, D] with D even and positions an integer [S]
// or [x's dim 0, S] (i64 or i32), and theta > 0.
void check_rotary_inputs(const Shape& x, DType x_dtype, const Shape& positions, DType positions_dtype, double theta);

Tensor rotary_embedding(const Tensor& x, const Tensor& positions, double theta);
// dx = the inverse rotation of dout (positions take no gradient).
Tensor rotary_embedding_backward(const Tensor& dout, const Tensor& positions, double theta);

}  // namespace shardwise::ops
