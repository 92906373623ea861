#include "shardwise/mesh/cp_order.h"

#include "shardwise/core/error.h"

namespace shardwise::mesh {

int64_t cp_balanced_position(int64_t index, int64_t seq, int64_t ranks) {
  SW_CHECK(ranks >= 1, "cp's balanced order: the number of ranks must be >= 1, got {}", ranks);
  SW_CHECK(index >= 0 && index < seq, "cp's balanced order: token {} is not in a sequence of {}", index, seq);
  if (ranks == 1) return index;
  SW_CHECK(seq % (2 * ranks) == 0,
           "cp's balanced order: a sequence of {} tokens does not cut into 2 x cp = {} equal chunks (make --seq a "
           "multiple of {})",
           seq, 2 * ranks, 2 * ranks);
  const int64_t chunk = seq / (2 * ranks), rank = index / (2 * chunk), within = index % (2 * chunk);
  const int64_t which = within < chunk ? rank : 2 * ranks - 1 - rank;
  return which * chunk + within % chunk;
}

std::vector<int64_t> cp_balanced_order(int64_t seq, int64_t ranks) {
  std::vector<int64_t> out(static_cast<size_t>(seq));
  for (int64_t x = 0; x < seq; ++x) out[static_cast<size_t>(x)] = cp_balanced_position(x, seq, ranks);
  return out;
}

}  // namespace shardwise::mesh
