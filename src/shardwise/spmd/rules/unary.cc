#include "shardwise/spmd/rules/families.h"
namespace shardwise::spmd { void register_unary_rules(RuleRegistry&) {} }
