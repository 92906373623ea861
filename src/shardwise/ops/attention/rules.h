#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the attention family (rules.cc), one member per rule; the family's ops take
// theirs from here when they register (ops.cc).
struct AttentionRules {
  spmd::Rule flash_attention;       // q, k, v
  spmd::Rule flash_attention_docs;  // q, k, v, document ids
  spmd::Rule ring_attention;        // q, k, v (the sequence sharded alike)
  spmd::Rule ring_attention_docs;   // q, k, v, document ids (whole)
};
AttentionRules attention_rules();

}  // namespace shardwise::ops
