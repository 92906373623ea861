#include "shardwise/core/philox.h"

#include <cmath>
#include <numbers>

namespace shardwise {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void round_once(PhiloxBlock& c, const std::array<uint32_t, 2>& k) {
  uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
  uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
  uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    round_once(counter, key);
  }
  return counter;
}

uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

PhiloxBlock Philox::block(uint64_t block_index) const {
  PhiloxBlock counter = {static_cast<uint32_t>(block_index), static_cast<uint32_t>(block_index >> 32),
                         static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)};
  return philox4x32_10(counter, {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
}

uint32_t Philox::bits(uint64_t index) const { return block(index / 4)[index % 4]; }

float Philox::uniform(uint64_t index) const {
  return static_cast<float>(bits(index) >> 8) * (1.0f / 16777216.0f);
}

double Philox::uniform_f64(uint64_t index) const {
  PhiloxBlock b = block(index / 2);
  size_t lane = (index % 2) * 2;
  uint64_t x = (static_cast<uint64_t>(b[lane]) << 21) ^ (b[lane + 1] >> 11);
  return static_cast<double>(x & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

float Philox::normal(uint64_t index) const {
  // Lanes (0,1) and (2,3) of a block form two Box-Muller pairs: lane 0/2 take the cosine,
  // lane 1/3 the sine. u1 is taken in (0, 1] so the logarithm is finite.
  PhiloxBlock b = block(index / 4);
  size_t pair = (index % 4) / 2 * 2;
  double u1 = (static_cast<double>(b[pair] >> 8) + 1.0) * (1.0 / 16777216.0);
  double u2 = static_cast<double>(b[pair + 1] >> 8) * (1.0 / 16777216.0);
  double radius = std::sqrt(-2.0 * std::log(u1));
  double angle = 2.0 * std::numbers::pi * u2;
  return static_cast<float>(index % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle));
}

}  // namespace shardwise
