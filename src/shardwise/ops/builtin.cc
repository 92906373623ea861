// The one place where the built-in op families are registered.
#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_builtin_ops(OpRegistry& registry) {
  register_unary_ops(registry);
  register_binary_ops(registry);
  register_reduction_ops(registry);
  register_matmul_ops(registry);
  register_shape_ops(registry);
  register_norm_ops(registry);
  register_softmax_ops(registry);
  register_index_ops(registry);
  register_channel_norm_ops(registry);
  register_misc_ops(registry);
}

}  // namespace shardwise::ops
