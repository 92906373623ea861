#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_index_ops(OpRegistry& registry) {}

}  // namespace shardwise::ops
