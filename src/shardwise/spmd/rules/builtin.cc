// The one place where the built-in rule families are registered.
#include "shardwise/spmd/rules/families.h"

namespace shardwise::spmd {

void register_builtin_rules(RuleRegistry& registry) {
  register_unary_rules(registry);
  register_binary_rules(registry);
  register_reduction_rules(registry);
  register_matmul_rules(registry);
  register_shape_rules(registry);
  register_norm_rules(registry);
  register_softmax_rules(registry);
  register_index_rules(registry);
  register_channel_norm_rules(registry);
  register_misc_rules(registry);
}

}  // namespace shardwise::spmd
