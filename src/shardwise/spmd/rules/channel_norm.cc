#include "shardwise/spmd/rules/families.h"

namespace shardwise::spmd {

void register_channel_norm_rules(RuleRegistry& registry) {}

}  // namespace shardwise::spmd
