#pragma once
// The next token from a row of logits: greedy (argmax, the lowest index on a tie) or a draw from
// the softmax of logits / temperature, restricted to the top-k tokens and then to the smallest
// set whose probability reaches top-p (nucleus). The draw is a Philox uniform keyed by
// (seed, sequence index, position): the same tokens on any mesh and for any batching of the
// prompts with the same indices.
#include <cstdint>
#include <span>

namespace shardwise::train {

struct SamplingConfig {
  double temperature = 0;  // 0: greedy; > 0: sample
  int64_t top_k = 0;       // 0: every token
  double top_p = 1.0;      // in (0, 1]
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0; }
  void validate() const;  // Error naming the bad field
};

// `sequence`: the prompt's index; `position`: the position the chosen token will take.
int64_t choose_token(std::span<const float> logits, const SamplingConfig& config, int64_t sequence, int64_t position);

}  // namespace shardwise::train
