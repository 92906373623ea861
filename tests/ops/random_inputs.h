#pragma once
// Seeded inputs the op families' tests share.
#include <cstdint>

#include "shardwise/tensor/tensor.h"

namespace shardwise::ops::testing {

// F64 values uniform in [-range, range), from a seeded linear congruential stream.
inline Tensor random_f64(const Shape& shape, uint64_t seed, double range = 1.0) {
  Tensor t(DType::F64, shape);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.set_at(i, (static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0) * range);
  }
  return t;
}

}  // namespace shardwise::ops::testing
