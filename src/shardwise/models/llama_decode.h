#pragma once
// The Llama of llama.h as generation's inference graphs (gpt_decode.h's DecoderGraph: the same
// inputs, outputs and contract as GPT-2's): the same parameters (names, [out, in] weights read
// transposed) and the same arithmetic as build_llama's evaluation graph (RMSNorm, rotary q and k,
// grouped-query attention, SwiGLU, the tied or untied head), with the same annotations:
//   dp  every per-sequence input and output sharded on the batch (dim 0)
//   tp  q/k/v and gate/up column-parallel, o and down row-parallel, the embedding and the untied
//       head vocab-parallel. The keys and values are the kv heads' (before repeat_kv):
//       [B, kv_heads, T, head_dim], sharded on dim 1 over tp when tp divides kv_heads, else
//       replicated over tp (every tp rank computes and caches all kv heads, as training computes
//       them), so a GQA cache holds kv_heads / tp (or kv_heads) heads per rank, not heads / tp.
//   ep  the batch split over dp x ep (a data dim); a MoE layer's experts w1, w3, w2 [E, ..] split on
//       E (each ep rank holds E / ep experts; moe_mlp exchanges the tokens all-to-all), as training.
//
// Positions. Prefill: every sequence starts at 0 (prompts right-padded), so the rotary op reads
// one row "positions" [T] (0 .. T-1) for the batch, as in training; the graph lists it in
// DecoderGraph::constants (bound once). Decode step: each sequence's token is at its own position
// p_b ("positions" [B, 1], as GPT-2's). rotary_embedding rotates the rows of x's dim -2 by one
// position each, so the step's q and k [B, n, 1, head_dim] are transposed to [n, 1, B, head_dim]
// (a row per sequence), rotated by the positions [B] and transposed back: the op and its proven
// rule unchanged (the batch dim, sharded on dp, carries its positions' shard).
#include "shardwise/models/gpt_decode.h"

namespace shardwise::train {

// Errors as build_gpt_prefill's, and build_llama's for the Llama fields.
DecoderGraph build_llama_prefill(const GptConfig& config, const Strategy& strategy, int64_t sequences, int64_t length,
                                 const DecodePart& part = {});
DecoderGraph build_llama_decode_step(const GptConfig& config, const Strategy& strategy, int64_t sequences,
                                     int64_t cache_length, const DecodePart& part = {});

// The placements of a Llama key or value [B, kv_heads, T, head_dim]: "S(0)" on dp, "S(1)" on tp
// when tp divides kv_heads (else R).
std::string llama_kv_placements(const GptConfig& config, const Strategy& strategy);
// The placements of a MoE layer's stacked experts [E, ..]: "S(0)" on ep, R elsewhere.
std::string expert_placements(const Strategy& strategy);

}  // namespace shardwise::train
