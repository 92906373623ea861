#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the matmul family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct MatmulRules {
  spmd::Rule matmul;
};
MatmulRules matmul_rules();

}  // namespace shardwise::ops
