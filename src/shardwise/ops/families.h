#pragma once
// One registration function per op family (defined in ops/<family>/ops.cc: it registers the
// family's ops, each holding its rule from the family's rules.cc); builtin.cc calls each of them.
#include "shardwise/ops/op.h"

namespace shardwise::ops {

void register_unary_ops(OpRegistry& registry);
void register_binary_ops(OpRegistry& registry);
void register_reduction_ops(OpRegistry& registry);
void register_matmul_ops(OpRegistry& registry);
void register_shape_ops(OpRegistry& registry);
void register_norm_ops(OpRegistry& registry);
void register_softmax_ops(OpRegistry& registry);
void register_index_ops(OpRegistry& registry);
void register_channel_norm_ops(OpRegistry& registry);
void register_misc_ops(OpRegistry& registry);

}  // namespace shardwise::ops
