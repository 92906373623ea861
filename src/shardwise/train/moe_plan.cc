#include "shardwise/train/moe_plan.h"
#include "shardwise/core/plural.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace shardwise::train {

MoeTraffic moe_traffic(const TrainConfig& c) {
  MoeTraffic t;
  const GptConfig& m = c.model;
  if (!m.is_llama() || m.experts == 0) return t;
  t.moe_layers = static_cast<int64_t>(moe_layer_list(m).size());
  const Strategy s = Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), c.parallel.sequence_parallel);
  t.micro_batches = c.optimizer.accumulation;
  t.ep = s.ep_size();
  t.top_k = m.top_k, t.experts = m.experts, t.hidden = m.hidden;
  t.tokens_per_micro_batch = c.optimizer.micro_batch * s.data_size() * m.seq;
  // dp x ep x cp: each rank routes its own sequences' tokens, on cp its blocks of them.
  const int64_t token_ranks = s.data_size() * s.cp_size();
  t.rank_tokens = (t.tokens_per_micro_batch + token_ranks - 1) / token_ranks;
  if (m.capacity_factor > 0) {
    t.capacity = static_cast<int64_t>(
        std::ceil(m.capacity_factor * static_cast<double>(t.tokens_per_micro_batch * m.top_k) / static_cast<double>(m.experts)));
  }
  const int64_t calls = t.moe_layers * t.micro_batches;  // each: 2 forward, 2 backward
  if (t.ep > 1) t.all_to_alls = 4 * calls;
  t.all_gathers = (token_ranks > 1 ? 2 : 0) * calls;  // the router sums carry the dispatch counts
  // Row widths in f32 elements of the four exchanges: dispatch d, combine d, backward 2d + 1 and d + 1.
  const double row_bytes = 4.0 * static_cast<double>(m.hidden + m.hidden + 2 * m.hidden + 1 + m.hidden + 1);
  const double rows = static_cast<double>(t.rank_tokens * m.top_k);
  if (t.ep > 1) {
    t.sent_max = static_cast<double>(calls) * rows * row_bytes;
    t.sent_uniform = t.sent_max * static_cast<double>(t.ep - 1) / static_cast<double>(t.ep);
  }
  const int64_t local_experts = m.experts / t.ep;
  t.received_rows_max = t.rank_tokens * t.ep * std::min(m.top_k, local_experts);
  if (t.capacity > 0) t.received_rows_max = std::min(t.received_rows_max, t.capacity * local_experts);
  return t;
}

namespace {

std::string mib(double bytes) { return fmt::format("{:.3f} MiB", bytes / (1024.0 * 1024.0)); }

}  // namespace

std::string MoeTraffic::table() const {
  if (moe_layers == 0) return "";
  std::string out = fmt::format(
      "moe traffic per step and rank: {} x {}, {} tokens each ({} on this rank), top-{} of {} "
      "experts over ep={}\n",
      counted(moe_layers, "MoE layer"), counted(micro_batches, "micro-batch"), tokens_per_micro_batch, rank_tokens, top_k, experts, ep);
  if (ep == 1) {
    out += fmt::format("  no ep dim: dispatch and combine are local copies (no all_to_all_v); {} all_gathers of router sums\n",
                       all_gathers);
    return out;
  }
  out += fmt::format("  all_to_all_v x{} (dispatch and combine, forward and backward), all_gather x{} (router sums and counts)\n",
                     all_to_alls, all_gathers);
  out += fmt::format("  on one node (the default there): no messages, each exchange writes the rows into the owners' "
                     "shared memory, {} shared barriers; MPI messages across nodes or with SHARDWISE_MOE_EXCHANGE=messages\n",
                     all_to_alls);
  out += fmt::format("  sent to other ranks: {} assuming uniform routing ((ep-1)/ep of the rows leave), at most {}\n",
                     mib(sent_uniform), mib(sent_max));
  out += fmt::format("  rows one rank's experts receive per dispatch: {} uniform, at most {} ({})\n",
                     rank_tokens * top_k, received_rows_max,
                     capacity > 0 ? fmt::format("capacity {} per expert", capacity) : "dropless: routing decides");
  return out;
}

nlohmann::json MoeTraffic::to_json() const {
  return {{"moe_layers", moe_layers},         {"micro_batches", micro_batches},
          {"ep", ep},                         {"tokens_per_micro_batch", tokens_per_micro_batch},
          {"rank_tokens", rank_tokens},       {"top_k", top_k},
          {"experts", experts},               {"capacity", capacity},
          {"all_to_all_v", all_to_alls},      {"all_gather", all_gathers},
          {"sent_bytes_uniform", sent_uniform}, {"sent_bytes_max", sent_max},
          {"received_rows_max", received_rows_max}};
}

}  // namespace shardwise::train
