#pragma once
// One registration function per rule family; builtin.cc calls each of them.
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {

void register_unary_rules(RuleRegistry& registry);
void register_binary_rules(RuleRegistry& registry);
void register_reduction_rules(RuleRegistry& registry);
void register_matmul_rules(RuleRegistry& registry);
void register_shape_rules(RuleRegistry& registry);
void register_norm_rules(RuleRegistry& registry);
void register_softmax_rules(RuleRegistry& registry);
void register_index_rules(RuleRegistry& registry);
void register_channel_norm_rules(RuleRegistry& registry);
void register_misc_rules(RuleRegistry& registry);

}  // namespace shardwise::spmd
