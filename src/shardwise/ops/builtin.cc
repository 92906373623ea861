// Registers every family of SHARDWISE_OP_FAMILIES (families.h), in list order.
#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_builtin_ops(OpRegistry& registry) {
#define SHARDWISE_CALL_REGISTER(family) register_##family##_ops(registry);
  SHARDWISE_OP_FAMILIES(SHARDWISE_CALL_REGISTER)
#undef SHARDWISE_CALL_REGISTER
}

}  // namespace shardwise::ops
