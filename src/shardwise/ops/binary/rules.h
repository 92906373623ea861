#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the binary family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct BinaryRules {
  spmd::Rule elementwise_add, elementwise_multiply, elementwise_divide, elementwise_max, elementwise_min, elementwise_binary, elementwise_where;
};
BinaryRules binary_rules();

}  // namespace shardwise::ops
