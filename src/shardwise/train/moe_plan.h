#pragma once
// The expert-parallel traffic of an MoE Llama's training step (`shardwise plan --memory` prints
// it): the collectives every MoE layer's moe_mlp runs (ops/moe/kernels.h) and the bytes its
// all_to_all_v calls move, per rank, per step.
//
// Per MoE layer and micro-batch, forward: an all_gather of each token block's router sums and
// counts over the token ranks (dp x ep), then dispatch (rows of d f32) and combine (d f32) by
// all_to_all_v (all_to_all_pieces) over ep; backward recomputes the routing (the same
// all_gather), dispatches rows [x | dout | weight] (2d + 1 f32) and returns [dx | dweight] (d + 1).
// A rank holds n = tokens of the micro-batch / (dp x ep) of the MoE layer's tokens and sends n x
// top_k assignment rows. Dropless, where they go depends on the routing: the estimate assumes
// uniform routing (each assignment on another ep rank with probability (ep - 1) / ep); the bound
// is every row leaving (sent) and a rank receiving n x ep x min(top_k, experts / ep) rows. With a
// capacity factor a rank's experts receive at most C = ceil(cf x tokens x top_k / experts) rows
// each, which bounds what a rank receives.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

struct MoeTraffic {
  int64_t moe_layers = 0, micro_batches = 0, ep = 1;
  int64_t tokens_per_micro_batch = 0;  // the MoE layer's N (global)
  int64_t rank_tokens = 0;             // n: this rank's share of N
  int64_t top_k = 0, experts = 0, hidden = 0;
  int64_t capacity = 0;                // C per expert and micro-batch (0: dropless)
  int64_t all_to_alls = 0;             // all_to_all_v calls per step on each rank (4 per layer and micro-batch)
  int64_t all_gathers = 0;             // all_gathers per step (2 per layer and micro-batch)
  // Bytes a rank sends to other ranks by all_to_all_v per step (all four directions): under uniform
  // routing, and at most (every row to another rank).
  double sent_uniform = 0, sent_max = 0;
  // Rows a rank's experts receive per dispatch at most (dropless: every assignment of the ep group
  // that can land there; capacity: C x its experts).
  int64_t received_rows_max = 0;
  std::string table() const;
  nlohmann::json to_json() const;
};

// `c` checked (batch sizes resolved); a model without experts gives moe_layers 0.
MoeTraffic moe_traffic(const TrainConfig& c);

}  // namespace shardwise::train
