#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the misc family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct MiscRules {
  spmd::Rule dropout, cumsum, arg_reduce, topk;
};
MiscRules misc_rules();

}  // namespace shardwise::ops
