#pragma once
// 16-bit floating-point storage types. Arithmetic happens in float; these only convert.
#include <bit>
#include <cstdint>
#include <cstring>

namespace shardwise {

// IEEE 754 binary16.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  f16(float value) : bits(from_float(value)) {}  // NOLINT: implicit like a built-in float type
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float value) {
    uint32_t x = std::bit_cast<uint32_t>(value);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or nan
      return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
    if (abs < 0x38800000u) {  // subnormal or zero in half
      // Shift the float (with implicit bit) into half's subnormal range, rounding to nearest even.
      if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
      uint32_t exp = abs >> 23;
      uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 13 - 1 ... chosen so result is in [0, 0x3ff]
      uint32_t half_mant = mant >> (shift);
      uint32_t rem = mant & ((1u << shift) - 1);
      uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
      return static_cast<uint16_t>(sign | half_mant);
    }
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
      if (mant == 0) {
        out = sign;
      } else {  // subnormal: normalize
        int e = -1;
        do {
          ++e;
          mant <<= 1;
        } while ((mant & 0x400u) == 0);
        out = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
      }
    } else if (exp == 31) {
      out = sign | 0x7f800000u | (mant << 13);
    } else {
      out = sign | (exp + 112u) << 23 | (mant << 13);
    }
    return std::bit_cast<float>(out);
  }
};

// bfloat16: the upper half of a float, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  bf16(float value) : bits(from_float(value)) {}  // NOLINT
  operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

  static uint16_t from_float(float value) {
    uint32_t x = std::bit_cast<uint32_t>(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
  }
};

}  // namespace shardwise
