#pragma once
// The candidates `shardwise plan --auto` searches (docs/planner.md): every mesh of dp x tp x pp x ep
// x cp that uses all the devices, with every sharding stage, recompute, sequence parallelism,
// micro-batch and pipeline schedule, less those the stated rules remove. Each rule is a function of
// the model's sizes and the candidate alone; `enumerate_candidates` counts what each removed.
//
// The rules, in the order they are applied (a candidate is counted under the first that removes it):
//   tp-heads     tp divides the attention heads and the key/value heads (each tp rank whole heads)
//   tp-sizes     tp divides the vocabulary, the hidden size and the MLP width (even shards)
//   tp-node      tp divides the devices of a node (a tp group inside one node: its all-reduces run
//                every layer, over the fast link)
//   pp-layers    every stage holds a layer (pp x virtual at most the layers); uneven stages and
//                interleaved chunks are kept, as train cuts them (pipeline::split_layers: the middle
//                ones take the extra layers, as Llama 3's 126 layers on 16 ranks x 4 chunks)
//   ep-experts   ep > 1 only on an MoE model, and ep divides the experts
//   sp-tp        sequence parallelism only with tp > 1, and tp divides the sequence
//   cp           context parallelism (cp > 1) only where train runs it: the sequence cuts into 2 x cp
//                equal chunks (cp's balanced order), no MoE layers, sharding stage 0-2, and each rank
//                keeps at least kMinCpTokens tokens of a sequence (below that the ring's exchange is
//                not hidden behind a block's attention: a stated pruning choice)
//   batch        dp x ep divides the global batch, and the micro-batch divides each data rank's share
//   pp-schedule  without pp only the default schedule (the others are the same step); with pp the
//                micro-batches are at least pp (every rank busy in the steady phase), a multiple of
//                pp for interleaved
//   sharding     a sharding stage above 0 needs more than one data rank, dp x ep x cp (else it is stage 0)
//   memory       (applied by the caller) the peak per device within the device's memory less a margin
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardwise::plan {

// What the search needs of the model and the job.
struct SearchSpace {
  int64_t devices = 1, devices_per_node = 1;
  int64_t layers = 1, heads = 1, kv_heads = 1, hidden = 1, mlp_width = 1, vocab = 1, seq = 1, experts = 0;
  int64_t global_batch = 1;
  std::vector<int> sharding_stages = {0, 1, 2, 3};
  std::vector<std::string> recompute = {"none", "full"};
  // Pipeline schedules; "interleaved" is tried with 2 virtual stages a rank.
  std::vector<std::string> schedules = {"1f1b", "fthenb", "interleaved", "zbh1"};
  bool sequence_parallel = true;  // also try --sequence-parallel where tp > 1
  bool context_parallel = true;   // also try cp > 1 (rule cp)
  // Micro-batch sizes tried: every divisor of a data rank's share up to this (0: no bound).
  int64_t max_micro_batch = 0;
};

// Rule cp: the fewest tokens of a sequence a cp rank keeps.
inline constexpr int64_t kMinCpTokens = 1024;

struct Candidate {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  bool sequence_parallel = false;
  int sharding_stage = 0;
  std::string recompute = "none";
  int64_t micro_batch = 1, accumulation = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  // The --mesh text: pp outermost, then dp, ep, cp, tp innermost (a tp group on consecutive ranks,
  // so inside a node; a cp group tp apart), dims of size 1 left out ("dp=1" when all are).
  std::string mesh() const;
  // "dp=4,tp=2 stage 1 recompute full micro-batch 2 x 4 1f1b" (sp and the schedule only where they apply).
  std::string describe() const;
};

inline constexpr const char* kSearchRules[] = {"tp-heads", "tp-sizes", "tp-node", "pp-layers", "ep-experts",
                                               "sp-tp", "cp", "batch", "pp-schedule", "sharding"};

// The rule that removes `c` ("" when none does).
std::string rejecting_rule(const SearchSpace& s, const Candidate& c);

struct Enumeration {
  std::vector<Candidate> kept;
  int64_t considered = 0;                // every combination looked at
  std::map<std::string, int64_t> removed;  // rule -> candidates it removed
};

// Every combination of the space, each either kept or counted under the rule that removes it.
// Error when the space itself is bad (no devices, a zero size).
Enumeration enumerate_candidates(const SearchSpace& s);

}  // namespace shardwise::plan
