#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the rotary family (rules.cc), one member per rule; the family's ops take
// theirs from here when they register (ops.cc).
struct RotaryRules {
  spmd::Rule rotary_embedding;
};
RotaryRules rotary_rules();

}  // namespace shardwise::ops
