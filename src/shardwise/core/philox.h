#pragma once
// Counter-based Philox-4x32-10 generator (Salmon et al., SC'11).
//
// A generator is keyed by (seed, stream): the 64-bit seed is the Philox key, and the 64-bit
// stream id fills the upper half of the 128-bit counter. Element i of a stream draws from
// counter block i / 4, lane i % 4, so any element can be computed on its own: a shard of a
// tensor draws exactly the numbers the whole tensor would hold at those global indices.
#include <array>
#include <cstdint>
#include <string_view>

namespace shardwise {

using PhiloxBlock = std::array<uint32_t, 4>;

// The raw bijection: 10 rounds of Philox-4x32 on `counter` under `key`.
PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key);

// A stable 64-bit id for a name (FNV-1a), used to key a stream by tensor name.
uint64_t stream_id(std::string_view name);

class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

  PhiloxBlock block(uint64_t block_index) const;
  uint32_t bits(uint64_t index) const;      // 32 random bits of element `index`
  float uniform(uint64_t index) const;      // [0, 1), 24-bit resolution
  double uniform_f64(uint64_t index) const; // [0, 1), 53-bit resolution (uses two lanes: index pairs)
  float normal(uint64_t index) const;       // standard normal (Box-Muller over lane pairs)

  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }

 private:
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace shardwise
