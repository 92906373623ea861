#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the unary family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct UnaryRules {
  spmd::Rule elementwise_unary, elementwise_unary_monotone, neg, scale, cast;
};
UnaryRules unary_rules();

}  // namespace shardwise::ops
