// The MoE router (softmax, top-k, renormalisation, global sums, capacity) and the dispatch plan.
#include "shardwise/ops/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include "shardwise/core/error.h"

namespace shardwise::ops {

MoeConfig moe_config(const Attrs& attrs, int64_t experts) {
  MoeConfig c;
  c.top_k = attrs.get_int("top_k");
  c.capacity_factor = attrs.get_float("capacity_factor", 0.0);
  c.normalize = attrs.get_bool("normalize", true);
  const std::string router = attrs.get_string("router", "softmax");
  SW_CHECK(router == "softmax" || router == "sigmoid", "moe_mlp: router '{}' must be softmax or sigmoid", router);
  c.sigmoid = router == "sigmoid";
  SW_CHECK(c.top_k >= 1 && c.top_k <= experts, "moe_mlp: top_k = {} must be in [1, experts = {}]", c.top_k,
           experts);
  SW_CHECK(c.capacity_factor >= 0.0 && std::isfinite(c.capacity_factor),
           "moe_mlp: capacity_factor = {} must be >= 0 (0: dropless)", c.capacity_factor);
  return c;
}

void check_moe_inputs(const Shape& x, const Shape& gate, const Shape& w1, const Shape& w3, const Shape& w2,
                      std::span<const DType> dtypes) {
  SW_CHECK(x.ndim() == 2, "moe_mlp: x must be [tokens, hidden], got {}", x.to_string());
  const int64_t d = x[1];
  SW_CHECK(gate.ndim() == 2 && gate[1] == d, "moe_mlp: gate must be [experts, hidden = {}], got {}", d,
           gate.to_string());
  const int64_t e = gate[0];
  SW_CHECK(e >= 1, "moe_mlp: gate {} names no expert", gate.to_string());
  SW_CHECK(w1.ndim() == 3 && w1[0] == e && w1[2] == d, "moe_mlp: w1 must be [experts = {}, ffn, hidden = {}], got {}",
           e, d, w1.to_string());
  const int64_t f = w1[1];
  SW_CHECK(w3 == w1, "moe_mlp: w3 {} must have w1's shape {}", w3.to_string(), w1.to_string());
  SW_CHECK(w2.ndim() == 3 && w2[0] == e && w2[1] == d && w2[2] == f,
           "moe_mlp: w2 must be [experts = {}, hidden = {}, ffn = {}], got {}", e, d, f, w2.to_string());
  check_moe_dtypes(dtypes);
}

void check_moe_dtypes(std::span<const DType> dtypes) {
  SW_CHECK(dtypes.size() == 5, "moe_mlp: takes the dtypes of 5 inputs, got {}", dtypes.size());
  const bool bf16 = dtypes[0] == DType::BF16;  // --compute bf16: the experts' operands bf16, the gate f32
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const DType want = bf16 && i == 1 ? DType::F32 : dtypes[0];
    SW_CHECK(dtypes[i] == want && (bf16 || dtypes[0] == DType::F32 || dtypes[0] == DType::F64),
             "moe_mlp: the inputs must be all f32 or all f64, or x, w1, w3, w2 bf16 with an f32 gate; input {} is {}, "
             "x is {}",
             i, dtype_name(dtypes[i]), dtype_name(dtypes[0]));
  }
}

DType moe_output_dtype(DType x_dtype) { return x_dtype == DType::BF16 ? DType::F32 : x_dtype; }

namespace moe_detail {

namespace {

template <class T>
void router_probs(const Tensor& x, const Tensor& gate, bool sigmoid, Routing& r) {
  const int64_t d = x.shape()[1];
  const T* xs = x.data<T>();
  const T* gs = gate.data<T>();
  std::vector<double> logit(static_cast<size_t>(r.experts));
  for (int64_t t = 0; t < r.tokens; ++t) {
    double mx = -INFINITY;
    for (int64_t e = 0; e < r.experts; ++e) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += static_cast<double>(xs[t * d + c]) * static_cast<double>(gs[e * d + c]);
      logit[static_cast<size_t>(e)] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (double v : logit) sum += std::exp(v - mx);
    double* p = &r.probs[static_cast<size_t>(t * r.experts)];
    std::copy(logit.begin(), logit.end(), r.logits.begin() + t * r.experts);
    for (int64_t e = 0; e < r.experts; ++e) {
      const double l = logit[static_cast<size_t>(e)];
      p[e] = !sigmoid ? std::exp(l - mx) / sum : l >= 0 ? 1.0 / (1.0 + std::exp(-l)) : std::exp(l) / (1.0 + std::exp(l));
    }
    r.lse[static_cast<size_t>(t)] = mx + std::log(sum);
  }
}

void choose_top_k(Routing& r, bool normalize) {
  std::vector<int64_t> idx(static_cast<size_t>(r.experts));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const double* p = &r.probs[static_cast<size_t>(t * r.experts)];
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + r.top_k, idx.end(), [p](int64_t a, int64_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    double sum = 0;
    for (int64_t s = 0; s < r.top_k; ++s) sum += p[idx[static_cast<size_t>(s)]];
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto a = static_cast<size_t>(t * r.top_k + s);
      r.expert[a] = idx[static_cast<size_t>(s)];
      r.weight[a] = normalize ? p[r.expert[a]] / sum : p[r.expert[a]];
    }
  }
}

constexpr size_t kHead = 3;  // a block row's token offset, expert offset, local experts

// Each token block's [token offset, expert offset, local experts, counts [top_k][E], prob sums
// [E], z sum], gathered over the token group into r.block_sums (one rank: its own).
void gather_block_sums(Routing& r, int64_t local_experts, const MoeShard& shard) {
  const size_t width = kHead + static_cast<size_t>(r.top_k * r.experts + r.experts) + 1;
  std::vector<double> mine(width, 0.0);
  mine[0] = static_cast<double>(shard.token_offset);
  mine[1] = static_cast<double>(shard.expert_offset);
  mine[2] = static_cast<double>(local_experts);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t s = 0; s < r.top_k; ++s) {
      mine[kHead + static_cast<size_t>(s * r.experts + r.expert[static_cast<size_t>(t * r.top_k + s)])] += 1.0;
    }
    for (int64_t e = 0; e < r.experts; ++e) {
      mine[kHead + static_cast<size_t>(r.top_k * r.experts + e)] += r.probs[static_cast<size_t>(t * r.experts + e)];
    }
    mine[width - 1] += r.lse[static_cast<size_t>(t)] * r.lse[static_cast<size_t>(t)];
  }
  r.blocks = shard.token_group ? shard.token_group->size() : 1;
  if (!shard.token_group) {
    r.block_sums = std::move(mine);
    return;
  }
  r.block_sums.resize(width * static_cast<size_t>(r.blocks));
  if (shard.moves) return shard.moves->gather_sums(*shard.token_group, mine, r.block_sums);
  shard.token_group->all_gather(mine.data(), r.block_sums.data(), static_cast<int64_t>(width), DType::F64);
}

size_t row_width(const Routing& r) { return r.block_sums.size() / static_cast<size_t>(r.blocks); }
const double* block_row(const Routing& r, int b) { return &r.block_sums[static_cast<size_t>(b) * row_width(r)]; }

// Capacity positions: where the first assignment of (slot, expert) of the block at token offset
// `offset` stands among every assignment to the expert, in (slot, global token) order: earlier
// slots' totals, then earlier token blocks' counts.
std::vector<int64_t> slot_bases(const Routing& r, double offset) {
  const auto ke = static_cast<size_t>(r.top_k * r.experts);
  std::vector<int64_t> before(ke, 0), slot_total(ke, 0);
  for (int b = 0; b < r.blocks; ++b) {
    const double* row = block_row(r, b);
    for (size_t i = 0; i < ke; ++i) {
      const auto c = static_cast<int64_t>(row[kHead + i]);
      slot_total[i] += c;
      if (row[0] < offset) before[i] += c;
    }
  }
  for (int64_t e = 0; e < r.experts; ++e) {
    int64_t earlier = 0;
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto i = static_cast<size_t>(s * r.experts + e);
      before[i] += earlier;
      earlier += slot_total[i];
    }
  }
  return before;
}

// Capacity: assignment (token t, slot s, expert e) is kept iff fewer than C assignments to e come
// before it in (slot, global token) order.
void apply_capacity(Routing& r, double capacity_factor, int64_t my_offset) {
  r.capacity = static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(r.tokens_total * r.top_k) / static_cast<double>(r.experts)));
  for (int64_t e = 0; e < r.experts; ++e) {
    r.dropped += std::max<int64_t>(0, static_cast<int64_t>(r.count_total[static_cast<size_t>(e)]) - r.capacity);
  }
  std::vector<int64_t> before = slot_bases(r, static_cast<double>(my_offset));
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto a = static_cast<size_t>(t * r.top_k + s);
      const int64_t pos = before[static_cast<size_t>(s * r.experts + r.expert[a])]++;
      r.kept[a] = pos < r.capacity ? 1 : 0;
    }
  }
}

// The assignments token block b keeps for each expert (what it sends there): its counts, less
// what capacity drops (the positions apply_capacity gives that block's assignments).
std::vector<int64_t> kept_counts_of_block(const Routing& r, int b) {
  const double* row = block_row(r, b);
  std::vector<int64_t> kept(static_cast<size_t>(r.experts), 0);
  std::vector<int64_t> base = r.capacity >= 0 ? slot_bases(r, row[0]) : std::vector<int64_t>{};
  for (int64_t s = 0; s < r.top_k; ++s) {
    for (int64_t e = 0; e < r.experts; ++e) {
      const auto i = static_cast<size_t>(s * r.experts + e);
      const auto c = static_cast<int64_t>(row[kHead + i]);
      kept[static_cast<size_t>(e)] += r.capacity < 0 ? c : std::clamp<int64_t>(r.capacity - base[i], 0, c);
    }
  }
  return kept;
}

}  // namespace

Routing route(const Tensor& x, const Tensor& gate, int64_t local_experts, const MoeConfig& cfg, const MoeShard& shard) {
  Routing r;
  r.tokens = x.shape()[0];
  r.experts = gate.shape()[0];
  r.top_k = cfg.top_k;
  r.tokens_total = shard.tokens_total < 0 ? r.tokens : shard.tokens_total;
  r.probs.assign(static_cast<size_t>(r.tokens * r.experts), 0.0);
  r.logits.assign(r.probs.size(), 0.0);
  r.lse.assign(static_cast<size_t>(r.tokens), 0.0);
  r.expert.assign(static_cast<size_t>(r.tokens * r.top_k), 0);
  r.weight.assign(r.expert.size(), 0.0);
  r.kept.assign(r.expert.size(), 1);
  if (x.dtype() == DType::F32) {
    router_probs<float>(x, gate, cfg.sigmoid, r);
  } else {
    router_probs<double>(x, gate, cfg.sigmoid, r);
  }
  choose_top_k(r, cfg.normalize);
  gather_block_sums(r, local_experts, shard);
  sum_blocks(r);
  if (cfg.capacity_factor > 0) apply_capacity(r, cfg.capacity_factor, shard.token_offset);
  return r;
}

void sum_blocks(Routing& r) {
  const size_t width = row_width(r);
  r.count_total.assign(static_cast<size_t>(r.experts), 0.0);
  r.prob_total.assign(static_cast<size_t>(r.experts), 0.0);
  for (int b = 0; b < r.blocks; ++b) {  // group-rank order: every rank sums alike
    const double* row = block_row(r, b);
    for (int64_t s = 0; s < r.top_k; ++s) {
      for (int64_t e = 0; e < r.experts; ++e) r.count_total[static_cast<size_t>(e)] += row[kHead + static_cast<size_t>(s * r.experts + e)];
    }
    for (int64_t e = 0; e < r.experts; ++e) {
      r.prob_total[static_cast<size_t>(e)] += row[kHead + static_cast<size_t>(r.top_k * r.experts + e)];
    }
    r.z_total += row[width - 1];
  }
}

double aux_loss_of(const Routing& r) {
  if (r.tokens_total == 0) return 0.0;
  const auto n = static_cast<double>(r.tokens_total);
  double s = 0;
  for (int64_t e = 0; e < r.experts; ++e) s += r.count_total[static_cast<size_t>(e)] * r.prob_total[static_cast<size_t>(e)];
  return static_cast<double>(r.experts) * s / (n * n);
}

double z_loss_of(const Routing& r) {
  return r.tokens_total == 0 ? 0.0 : r.z_total / static_cast<double>(r.tokens_total);
}

namespace {

// The token block (index into r.block_sums) of each expert-group peer: the same process's row of
// the token group, which contains the expert group.
std::vector<int> peer_blocks(const MoeShard& shard, int peers) {
  if (!shard.expert_group) return {shard.token_group ? shard.token_group->rank() : 0};
  SW_CHECK(shard.token_group, "moe_mlp: the experts are split over {} ranks but the tokens are not", peers);
  const std::vector<int>& tokens = shard.token_group->members();
  std::vector<int> blocks(static_cast<size_t>(peers), -1);
  for (int p = 0; p < peers; ++p) {
    const int global = shard.expert_group->members()[static_cast<size_t>(p)];
    const auto at = std::find(tokens.begin(), tokens.end(), global);
    SW_CHECK(at != tokens.end(), "moe_mlp: rank {} of the expert group does not hold a token block", global);
    blocks[static_cast<size_t>(p)] = static_cast<int>(at - tokens.begin());
  }
  return blocks;
}

}  // namespace

namespace {

// plan_dispatch, or with `sizes_only` plan_sizes: this rank's rows for each expert from its
// gathered counts, no order.
DispatchPlan plan_of(const Routing& r, int64_t local_experts, const MoeShard& shard, bool sizes_only) {
  DispatchPlan plan;
  plan.local_experts = local_experts;
  std::vector<std::vector<int64_t>> bucket(static_cast<size_t>(r.experts));
  for (size_t a = 0; a < r.expert.size() && !sizes_only; ++a) {
    if (r.kept[a]) bucket[static_cast<size_t>(r.expert[a])].push_back(static_cast<int64_t>(a));
  }
  plan.peers = shard.expert_group ? shard.expert_group->size() : 1;
  const std::vector<int> blocks = peer_blocks(shard, plan.peers);
  std::vector<int> owner(static_cast<size_t>(r.experts), -1);
  for (int p = 0; p < plan.peers; ++p) {
    const double* row = block_row(r, blocks[static_cast<size_t>(p)]);
    const auto lo = static_cast<int64_t>(row[1]), n = static_cast<int64_t>(row[2]);
    for (int64_t e = lo; e < lo + n; ++e) {
      SW_CHECK(e >= 0 && e < r.experts && owner[static_cast<size_t>(e)] < 0,
               "moe_mlp: expert {} is held by two ranks of the expert group (or is out of range)", e);
      owner[static_cast<size_t>(e)] = p;
    }
  }
  for (int64_t e = 0; e < r.experts; ++e) {
    SW_CHECK(owner[static_cast<size_t>(e)] >= 0, "moe_mlp: no rank of the expert group holds expert {}", e);
  }
  plan.send_rows.assign(static_cast<size_t>(plan.peers), 0);
  plan.recv_rows.assign(static_cast<size_t>(plan.peers), 0);
  plan.rows_from.assign(static_cast<size_t>(plan.peers * local_experts), 0);
  plan.expert_rows.assign(static_cast<size_t>(local_experts), 0);
  plan.send_first.assign(1, 0);
  plan.peer_rows.assign(static_cast<size_t>(plan.peers), 0);
  std::vector<std::vector<int64_t>> kept_of(static_cast<size_t>(plan.peers));  // [peer][expert]
  for (int p = 0; p < plan.peers; ++p) kept_of[static_cast<size_t>(p)] = kept_counts_of_block(r, blocks[static_cast<size_t>(p)]);
  const int me = shard.expert_group ? shard.expert_group->rank() : 0;
  int64_t next = 0;  // sizes_only: the experts in send order are the experts in order
  for (int p = 0; p < plan.peers; ++p) {
    const double* row = block_row(r, blocks[static_cast<size_t>(p)]);
    const auto lo = static_cast<int64_t>(row[1]), n = static_cast<int64_t>(row[2]);
    SW_CHECK(!sizes_only || lo == next,
             "moe_mlp: rank {} of the expert group holds experts from {}, not {}: a router on a device sends its "
             "rows in expert order, which needs the ranks to hold the experts in rank order", p, lo, next);
    next = lo + n;
    int64_t& at = plan.peer_rows[static_cast<size_t>(p)];  // expert e's first row in p's rows, then their total
    for (int64_t e = lo; e < lo + n; ++e) {
      const auto& b = bucket[static_cast<size_t>(e)];
      plan.order.insert(plan.order.end(), b.begin(), b.end());
      const int64_t mine = sizes_only ? kept_of[static_cast<size_t>(me)][static_cast<size_t>(e)] : static_cast<int64_t>(b.size());
      plan.send_rows[static_cast<size_t>(p)] += mine;
      plan.send_expert_rows.push_back(mine);
      int64_t before = 0, total = 0;  // rows for e from the peers before this rank, from all
      for (int q = 0; q < plan.peers; ++q) {
        const int64_t c = kept_of[static_cast<size_t>(q)][static_cast<size_t>(e)];
        before += q < me ? c : 0;
        total += c;
      }
      SW_CHECK(kept_of[static_cast<size_t>(me)][static_cast<size_t>(e)] == mine,
               "moe_mlp: this rank keeps {} rows for expert {} but its gathered counts say {}", mine, e,
               kept_of[static_cast<size_t>(me)][static_cast<size_t>(e)]);
      plan.send_at.push_back(at + before);
      at += total;
    }
    plan.send_first.push_back(static_cast<int64_t>(plan.send_expert_rows.size()));
    const std::vector<int64_t>& kept = kept_of[static_cast<size_t>(p)];
    for (int64_t j = 0; j < local_experts; ++j) {
      const int64_t rows = kept[static_cast<size_t>(shard.expert_offset + j)];
      plan.rows_from[static_cast<size_t>(p * local_experts + j)] = rows;
      plan.recv_rows[static_cast<size_t>(p)] += rows;
      plan.expert_rows[static_cast<size_t>(j)] += rows;
    }
  }
  return plan;
}

}  // namespace

DispatchPlan plan_dispatch(const Routing& r, int64_t local_experts, const MoeShard& shard) {
  return plan_of(r, local_experts, shard, false);
}

DispatchPlan plan_sizes(const Routing& r, int64_t local_experts, const MoeShard& shard) {
  return plan_of(r, local_experts, shard, true);
}

MoeExchange exchange_wanted(MoeExchange exchange) {
  if (exchange != MoeExchange::Auto) return exchange;
  const char* env = std::getenv("SHARDWISE_MOE_EXCHANGE");
  const std::string_view v = env ? env : "";
  if (v.empty()) return MoeExchange::Auto;
  if (v == "messages") return MoeExchange::Messages;
  if (v == "shared") return MoeExchange::Shared;
  fail("SHARDWISE_MOE_EXCHANGE={}: the MoE exchange is 'messages' or 'shared' (unset: shared where the expert "
       "group shares memory)",
       v);
}

}  // namespace moe_detail

void check_moe_exchange_setting() { moe_detail::exchange_wanted(MoeExchange::Auto); }

}  // namespace shardwise::ops
