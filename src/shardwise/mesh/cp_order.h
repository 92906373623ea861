#pragma once
// Context parallelism's load-balanced sequence order (Megatron-Core's and ring-flash-attention's
// "zigzag" split). A causal sequence cut into cp contiguous blocks gives the last rank most of the
// attention work (its queries see the most keys). Instead the sequence of T tokens is cut into
// 2 cp chunks of T / (2 cp) and stored in the order 0, 2cp-1, 1, 2cp-2, ..., cp-1, cp: a
// contiguous S(1) split over cp then gives rank i the chunks i and 2cp-1-i, one early and one late,
// and every rank the same number of visible (query, key) pairs up to one chunk's diagonal.
#include <cstdint>
#include <vector>

namespace shardwise::mesh {

// The position in the original sequence of token `index` of a sequence of `seq` tokens stored in
// the balanced order over `ranks` ranks (ranks 1: the identity). Error unless 2 ranks divides seq
// (ranks > 1) and index is in [0, seq).
int64_t cp_balanced_position(int64_t index, int64_t seq, int64_t ranks);
// cp_balanced_position of every index: order[x] is the original position of stored token x.
std::vector<int64_t> cp_balanced_order(int64_t seq, int64_t ranks);

}  // namespace shardwise::mesh
