#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the norm family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct NormRules {
  spmd::Rule layer_norm, rms_norm;
};
NormRules norm_rules();

}  // namespace shardwise::ops
