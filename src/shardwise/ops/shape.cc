#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_shape_ops(OpRegistry& registry) {}

}  // namespace shardwise::ops
