#pragma once
// The built-in op families, one folder each: ops/<family>/ holds its kernels, its SPMD rules and
// its registry entries, and defines register_<family>_ops (in ops.cc), which registers every op
// of the family with the rule it holds. Adding a family is its folder plus one name in this list.
#include "shardwise/ops/op.h"

#define SHARDWISE_OP_FAMILIES(X) \
  X(unary)                       \
  X(binary)                      \
  X(reduction)                   \
  X(matmul)                      \
  X(shape)                       \
  X(norm)                        \
  X(softmax)                     \
  X(index)                       \
  X(channel_norm)                \
  X(misc)                        \
  X(activation)                  \
  X(rotary)                      \
  X(moe)                         \
  X(attention)

namespace shardwise::ops {

#define SHARDWISE_DECLARE_REGISTER(family) void register_##family##_ops(OpRegistry& registry);
SHARDWISE_OP_FAMILIES(SHARDWISE_DECLARE_REGISTER)
#undef SHARDWISE_DECLARE_REGISTER

}  // namespace shardwise::ops
