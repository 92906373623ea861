// The kernels' shared sigmoid (ops/sigmoid.h), computed without a branch on the sign, against the
// two-branch form it replaced, bit for bit, over floats and doubles across their range.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "shardwise/ops/sigmoid.h"

namespace shardwise::ops {
namespace {

template <class C>
C two_branch(C x) {
  if (x >= 0) return C(1) / (C(1) + std::exp(-x));
  const C e = std::exp(x);
  return e / (C(1) + e);
}

template <class C, class Bits>
void expect_same_bits(C x) {
  EXPECT_EQ(std::bit_cast<Bits>(sigmoid_of(x)), std::bit_cast<Bits>(two_branch(x))) << x;
}

TEST(Sigmoid, EqualsTheTwoBranchFormBitForBit) {
  int checked = 0;
  for (float x = -120.0f; x <= 120.0f; x += 0.0137f, ++checked) expect_same_bits<float, uint32_t>(x);
  for (double x = -750.0; x <= 750.0; x += 0.0731, ++checked) expect_same_bits<double, uint64_t>(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, std::numeric_limits<float>::denorm_min(), 88.7f, -88.7f, -104.0f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    expect_same_bits<float, uint32_t>(x);
  EXPECT_GT(checked, 30000);
  EXPECT_TRUE(std::isnan(sigmoid_of(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace shardwise::ops
