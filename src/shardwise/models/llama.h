#pragma once
// A Llama-family decoder (transformers' LlamaForCausalLM) built with the graph builder: a token
// embedding, pre-RMSNorm blocks (causal grouped-query attention with rotary position embeddings,
// a SwiGLU MLP), a final RMSNorm and an LM head, untied (lm_head.weight) or tied to the embedding
// (tie_word_embeddings); no biases; mean cross-entropy over the next tokens. GptConfig holds the
// configuration (model_type "llama": kv_heads, intermediate_size, rope_theta, rms_norm_eps,
// tie_word_embeddings) and the graph is a GptGraph, so the stages, the trainer and the checkpoints
// run it as they run GPT-2 (models.h dispatches).
//
// Parameters have transformers' names and layouts: every projection weight is [out, in] (nn.Linear)
// and the matmuls read it transposed, so checkpoints are Llama's files as they are (no key map).
// Parallel strategies are annotations:
//   dp  ids and labels sharded on the batch
//   tp  q/k/v and gate/up column-parallel (weights S(0): output features), o and down row-parallel
//       (weights S(1): input features), the embedding and the untied head vocab-parallel (S(0)),
//       vocab-parallel cross-entropy. k and v are sharded by kv heads when tp divides kv_heads; else
//       they are replicated over tp: every tp rank computes all kv heads (k/v projections and their
//       weights' memory tp times over, the weight gradients all-reduced over tp) and slices the
//       repeated heads its q heads read.
//   sp  (with tp) the residual stream and the norms sharded on the sequence over tp
// Grouped-query attention repeats each kv head for heads / kv_heads q heads (transformers'
// repeat_kv: reshape, expand, reshape), so head h reads kv head h / (heads / kv_heads).
// Positions are the graph input "positions" [S] (0 .. S-1), read by the rotary_embedding op; with
// packed documents (document_mask) every stage takes "position_ids" [B, S] (restarting at each
// document) and "attention_mask" [B, 1, S, S] per micro-batch instead, as GPT-2's first stage does.
#include <array>
#include <string>

#include "shardwise/models/gpt.h"

namespace shardwise::train {

// Qwen3's per-head RMSNorm of q and k (q_norm, k_norm: a weight [head dim] each) before rotary.
inline bool qk_norm(const GptConfig& config) { return config.family == "qwen3"; }

// Error naming the field unless the Llama fields fit: kv heads dividing heads, an even head dim
// (rotary halves), a positive MLP width, rope theta and epsilon.
void validate_llama(const GptConfig& config);

// The graph of one micro-batch (as build_gpt: inputs "ids", "labels", "causal_mask", and
// "positions" [S] i64; or with document_mask "attention_mask" and "position_ids" [B, S]), annotated for `strategy`; errors name what does not divide.
GptGraph build_llama(const GptConfig& config, const Strategy& strategy, int64_t sequences, bool training = true,
                     const GptPart& part = {});

// The initial value of one block of a Llama parameter: RMSNorm weights 1, every other weight
// normal(0, init_std) from Philox keyed by (seed, name) at the global element index (as
// transformers' _init_weights: no scaled residual projections).
Tensor init_llama_param_block(const GptConfig& config, const std::string& name, const Shape& shape,
                              std::span<const int64_t> offset, const Shape& block, uint64_t seed);

// The values of MoE layer `layer`'s router statistics in its graph: moe_mlp's outputs aux_loss,
// z_loss, dropped and expert_tokens (the training metrics read them).
std::array<std::string, 4> moe_stat_names(int64_t layer);
// The statistics outputs of the moe_mlp node whose first output is `op`: op:1 .. op:4.
std::array<std::string, 4> moe_op_stat_names(const std::string& op);

// The [S] i64 positions 0 .. S-1 (the graph input "positions"); with cp_order c > 1 each stored
// token's original position in cp's balanced order over c ranks (mesh/cp_order.h).
Tensor position_ids(int64_t seq, int64_t cp_order = 1);

}  // namespace shardwise::train
