#pragma once
// The MoE kernels' internals shared by routing.cc and kernels.cc: the router's decisions on this
// rank's tokens and the plan of one dispatch.
#include <cstdint>
#include <vector>

#include "shardwise/ops/moe/kernels.h"

namespace shardwise::ops::moe_detail {

// The router on the local tokens, with the global sums the aux loss and capacity need.
struct Routing {
  int64_t tokens = 0, experts = 0, top_k = 0, tokens_total = 0;
  std::vector<double> probs;         // [tokens, experts] softmax (or sigmoid) of the logits
  std::vector<double> logits;        // [tokens, experts]
  std::vector<double> lse;           // [tokens] logsumexp of the logits
  std::vector<int64_t> expert;       // [tokens * top_k] chosen experts, by descending p
  std::vector<double> weight;        // [tokens * top_k] their (renormalised) weights
  std::vector<uint8_t> kept;         // [tokens * top_k] 0: dropped by capacity
  std::vector<double> count_total;   // [experts] assignments over every token (before drops)
  std::vector<double> prob_total;    // [experts] sum over every token of p
  double z_total = 0;                // sum over every token of lse^2
  int64_t dropped = 0;               // assignments dropped over every token
  int64_t capacity = -1;             // assignments an expert keeps (-1: dropless)
  // Every token block's row, gathered over the token group in group-rank order (one rank: its
  // own): [token offset, expert offset, local experts, counts [top_k][E], prob sums [E], sum lse^2].
  std::vector<double> block_sums;
  int blocks = 1;
};

// Routes x's local rows (f32 or f64) through gate [E, d]; collective over shard.token_group (one
// all_gather, which also carries this rank's expert range [shard.expert_offset, +local_experts)
// and counts: plan_dispatch needs no collective of its own).
Routing route(const Tensor& x, const Tensor& gate, int64_t local_experts, const MoeConfig& cfg, const MoeShard& shard);

// count_total, prob_total and z_total: the sums of r.block_sums' rows in group-rank order (every
// rank sums alike). route() calls it; a router on a device, after gathering its rows.
void sum_blocks(Routing& r);

// The aux loss and z-loss from the global sums (0 when there are no tokens).
double aux_loss_of(const Routing& r);
double z_loss_of(const Routing& r);

// Where each kept assignment goes within shard.expert_group and what this rank receives.
struct DispatchPlan {
  int peers = 1;
  int64_t local_experts = 0;
  std::vector<int64_t> order;      // kept assignment indices (token * top_k + slot) in send order
  std::vector<int64_t> send_rows;  // [peers]
  // The rows sent to each of peer p's experts, in order: [send_first[p], send_first[p + 1]).
  std::vector<int64_t> send_first, send_expert_rows;
  std::vector<int64_t> recv_rows;  // [peers]
  std::vector<int64_t> rows_from;  // [peers * local_experts]: rows from peer p for local expert j
  std::vector<int64_t> expert_rows;  // [local_experts]
  // Where this rank's rows land in each peer's expert-major rows (the shared-memory exchange
  // writes them there itself): send piece i's first row is row send_at[i] of its peer's rows.
  std::vector<int64_t> send_at;    // [send_expert_rows.size()]
  std::vector<int64_t> peer_rows;  // [peers]: the rows each peer's experts receive in all
};
// No collective: each expert-group peer's expert range and kept counts per expert come from its
// token block's row in r.block_sums (the expert group is within the token group).
DispatchPlan plan_dispatch(const Routing& r, int64_t local_experts, const MoeShard& shard);
// Its sizes alone (order empty): this rank's rows for each expert from its own gathered counts,
// for a router whose decisions stay on a device (r.expert and r.kept empty; dropless: r.capacity -1).
DispatchPlan plan_sizes(const Routing& r, int64_t local_experts, const MoeShard& shard);

// The exchange a call asks for: `exchange` unless Auto, else SHARDWISE_MOE_EXCHANGE's (messages,
// shared; unset or empty: Auto, i.e. shared where available). Error on another value.
MoeExchange exchange_wanted(MoeExchange exchange);

}  // namespace shardwise::ops::moe_detail
