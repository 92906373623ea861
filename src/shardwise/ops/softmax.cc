#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_softmax_ops(OpRegistry& registry) {}

}  // namespace shardwise::ops
