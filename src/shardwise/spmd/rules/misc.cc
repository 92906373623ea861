#include "shardwise/spmd/rules/families.h"

namespace shardwise::spmd {

void register_misc_rules(RuleRegistry& registry) {}

}  // namespace shardwise::spmd
