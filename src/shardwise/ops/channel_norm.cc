#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_channel_norm_ops(OpRegistry& registry) {}

}  // namespace shardwise::ops
