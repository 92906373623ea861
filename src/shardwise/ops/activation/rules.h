#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the activation family (rules.cc), one member per rule; the family's ops take
// theirs from here when they register (ops.cc).
struct ActivationRules {
  spmd::Rule swiglu;
};
ActivationRules activation_rules();

}  // namespace shardwise::ops
