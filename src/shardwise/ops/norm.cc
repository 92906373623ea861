#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_norm_ops(OpRegistry& registry) {}

}  // namespace shardwise::ops
