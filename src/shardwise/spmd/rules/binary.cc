#include "shardwise/spmd/rules/families.h"
namespace shardwise::spmd { void register_binary_rules(RuleRegistry&) {} }
