#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the moe family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct MoeRules {
  spmd::Rule moe_mlp;
};
MoeRules moe_rules();

}  // namespace shardwise::ops
