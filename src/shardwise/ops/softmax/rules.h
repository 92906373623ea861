#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the softmax family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct SoftmaxRules {
  spmd::Rule softmax, cross_entropy, vocab_parallel_cross_entropy;
  spmd::Rule lm_head_cross_entropy, vocab_parallel_lm_head_cross_entropy;
};
SoftmaxRules softmax_rules();

}  // namespace shardwise::ops
