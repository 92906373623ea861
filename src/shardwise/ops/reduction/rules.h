#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the reduction family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct ReductionRules {
  spmd::Rule reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_amax, reduce_amin, reduce_prod;
};
ReductionRules reduction_rules();

}  // namespace shardwise::ops
