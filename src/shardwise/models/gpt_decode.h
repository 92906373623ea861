#pragma once
// The GPT of gpt.h as inference graphs for generation: the same parameters (names, shapes,
// Linear weights [in, out]) and the same arithmetic as build_gpt's evaluation graph, written for
// incremental decoding with a KV cache. Parallelism is annotations, as in build_gpt:
//   dp  every per-sequence input and output sharded on the batch (dim 0)
//   tp  q/k/v and fc column-parallel, the projections row-parallel, the embedding and tied head
//       vocab-parallel; the keys and values [B, heads, T, head_dim] sharded on the heads (dim 1),
//       so each tp rank caches the keys and values of its own heads only
// Two graphs, each with fixed shapes (planned once, run many times):
//
// Prefill (`build_gpt_prefill`, batch B, length T): the prompts right-padded to T.
//   inputs   "ids" [B, T] i64, "positions" [B, T] i64 (0, 1, ..., T-1), "causal_mask" [T, T],
//            "last" [B, 1, T] f32: one-hot at each sequence's last real position
//   outputs  "logits" [B, 1, V] at the selected positions (last @ hidden: an exact row selection),
//            each layer's keys and values [B, heads, T, head_dim] (DecoderGraph::present_k / _v)
//   A real position never attends to the padding after it (causal), so its keys and values are
//   those of the prompt alone; the padding's are overwritten by later steps or masked out.
//
// Decode step (`build_gpt_decode_step`, batch B, cache length C): one new token per sequence.
//   inputs   "ids" [B, 1] i64 (the token), "positions" [B, 1] i64 (its position p_b),
//            "past.<l>.k", "past.<l>.v" [B, heads, C, head_dim] (the cache),
//            "cache_mask" [B, 1, 1, C + 1]: 0 where the token may attend (cache slots < p_b, and
//            the last column: the token itself), -1e9 elsewhere
//   outputs  "logits" [B, 1, V], each layer's key and value of the token [B, heads, 1, head_dim]
//            (present_k / _v), which the caller writes into the cache at slot p_b
//   The attention reads concat(past, present) along the sequence: the cache is never written by
//   the graph, so its layout (batch on dp, heads on tp) is the caller's buffer, bound in place.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardwise/graph/graph.h"
#include "shardwise/models/gpt.h"

namespace shardwise::train {

// A pipeline stage's part of a decoder graph (generation on a pp mesh: the stages run in turn for
// each token): layers [first_layer, end_layer) (-1: to the last); without `embeddings` the residual
// stream enters as the input "hidden" [B, T, H] instead of the ids, without `head` it leaves as
// DecoderGraph::hidden (no logits). Both in stage_stream_placements (the batch on the data dims).
struct DecodePart {
  int64_t first_layer = 0, end_layer = -1;
  bool embeddings = true, head = true;
  int64_t end(const GptConfig& c) const { return end_layer < 0 ? c.layers : end_layer; }
};

struct DecoderGraph {
  graph::Graph g;
  int64_t sequences = 0;  // B, on the whole dp dim
  int64_t length = 0;     // prefill: T; decode step: the cache length C
  std::string logits = "logits";  // empty on a stage without the head
  std::string hidden;             // a stage without the head: the residual stream it hands on
  std::vector<std::string> present_k, present_v;  // per layer: the values holding the keys and values
  std::vector<std::string> past_k, past_v;        // per layer (decode step only)
  std::map<std::string, Tensor> constants;         // inputs bound once per graph (the prefill's causal_mask)
};

// Errors name what does not divide (heads over tp, sequences over dp) or a length outside
// [1, positions].
DecoderGraph build_gpt_prefill(const GptConfig& config, const Strategy& strategy, int64_t sequences, int64_t length,
                               const DecodePart& part = {});
DecoderGraph build_gpt_decode_step(const GptConfig& config, const Strategy& strategy, int64_t sequences,
                                   int64_t cache_length, const DecodePart& part = {});

// The residual stream between pipeline stages [B, T, H]: "S(0)" on the data dims, R elsewhere.
std::string stage_stream_placements(const Strategy& strategy);
// A stage's entry: `embed()` with the embeddings, else the input "hidden" [B, T, H] (annotated).
graph::ValueId stage_entry(graph::Graph& g, const Strategy& s, const DecodePart& part, Shape stream,
                           const std::function<graph::ValueId()>& embed);
// A stage's exit: without the head `x` becomes out.hidden, in the stream's layout, and true (the
// graph is complete); with the head false (the caller adds it).
bool stage_exit(DecoderGraph& out, const Strategy& s, const DecodePart& part, graph::ValueId x);

// Error unless the mesh has no pp dim (a stage's mesh: the Generator cuts a pp mesh), tp divides the heads, dp the sequences, and `length` (the
// prefill's or the cache's, `what`) is in [1, positions]. Both models' builders check this first.
void check_decoder_shape(const GptConfig& config, const Strategy& strategy, int64_t sequences, int64_t length,
                         const char* what);

// The placements string of a [B, heads, T, head_dim] key or value (and any tensor with the batch
// on dim 0 and the heads on dim 1): "S(0)" on dp, "S(1)" on tp, R elsewhere.
std::string kv_placements(const Strategy& strategy);

}  // namespace shardwise::train
