#include <gtest/gtest.h>

#include <cmath>

#include "shardwise/core/philox.h"

namespace shardwise {
namespace {

// Known-answer vectors of Philox4x32-10 published with the Random123 library (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, ElementsAreAddressableAndStreamsDiffer) {
  Philox a(42, 7), b(42, 8), c(43, 7);
  // bits(i) is lane i%4 of block i/4, whatever order elements are asked in.
  for (uint64_t i : {0ull, 1ull, 5ull, 1000003ull}) EXPECT_EQ(a.bits(i), a.block(i / 4)[i % 4]);
  EXPECT_NE(a.bits(0), b.bits(0));
  EXPECT_NE(a.bits(0), c.bits(0));
  EXPECT_EQ(Philox(42, 7).bits(123456789), a.bits(123456789));
}

TEST(Philox, UniformAndNormalHaveTheRightMoments) {
  Philox g(2026, stream_id("w"));
  const int n = 200000;
  double s = 0, s2 = 0, u = 0;
  for (int i = 0; i < n; ++i) {
    double x = g.normal(static_cast<uint64_t>(i));
    s += x;
    s2 += x * x;
    float v = g.uniform(static_cast<uint64_t>(i));
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, 1.0f);
    u += v;
    double w = g.uniform_f64(static_cast<uint64_t>(i));
    ASSERT_GE(w, 0.0);
    ASSERT_LT(w, 1.0);
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(u / n, 0.5, 0.005);
}

}  // namespace
}  // namespace shardwise
