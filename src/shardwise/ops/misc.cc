#include "shardwise/ops/families.h"

namespace shardwise::ops {

void register_misc_ops(OpRegistry& registry) {}

}  // namespace shardwise::ops
