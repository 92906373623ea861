#pragma once
// What the exchange-backend checkpoint tests save (tests/ckpt/test_checkpoint_exchange.cc), in
// threads and in the helper processes (tests/ckpt_helper/save_through_files.cc) alike: the small
// model on dp=2 x tp=2 at step 3, in shards of at most 300 bytes, every replicated block split
// among its replicas (so that several ranks write pieces of one file).
#include "ckpt_test_util.h"

namespace shardwise::ckpt::testing {

inline constexpr int64_t kExchangeStep = 3;

inline const Topology& exchange_topology() {
  static const Topology topo = [] {
    for (const Topology& t : topologies()) {
      if (t.label == "dp2tp2") return t;
    }
    return topologies().front();
  }();
  return topo;
}

inline SaveOptions exchange_save_options() {
  SaveOptions options;
  options.max_shard_bytes = 300;
  options.split_bytes = 0;
  return options;
}

}  // namespace shardwise::ckpt::testing
