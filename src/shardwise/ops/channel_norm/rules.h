#pragma once
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the channel_norm family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct ChannelNormRules {
  spmd::Rule batch_norm, sync_batch_norm, group_norm, instance_norm;
};
ChannelNormRules channel_norm_rules();

}  // namespace shardwise::ops
