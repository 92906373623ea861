#include <gtest/gtest.h>

#include <cmath>

#include "shardwise/tensor/fast_math.h"

namespace shardwise {
namespace {

TEST(FastMath, ExpIsWithinAFewUlpOfStdExp) {
  double worst = 0;
  for (double x = -87; x <= 88; x += 0.000731) {
    double want = std::exp(x), got = fast_expf(static_cast<float>(x));
    double ref = std::exp(static_cast<double>(static_cast<float>(x)));
    worst = std::max(worst, std::abs(got - ref) / ref);
    (void)want;
  }
  EXPECT_LT(worst, 4e-7);  // about 3 float ulp
}

TEST(FastMath, TanhHasASmallAbsoluteErrorEverywhere) {
  double worst = 0;
  for (double u = -20; u <= 20; u += 0.0001) {
    float f = static_cast<float>(u);
    worst = std::max(worst, std::abs(fast_tanhf(f) - std::tanh(static_cast<double>(f))));
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fast_tanhf(0.0f), 0.0f);
  EXPECT_EQ(fast_tanhf(30.0f), 1.0f);
  EXPECT_EQ(fast_tanhf(-30.0f), -1.0f);
}

}  // namespace
}  // namespace shardwise
