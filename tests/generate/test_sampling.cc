// choose_token against the distributions it should draw from: frequencies over many positions
// within a few standard errors of softmax(logits / T) restricted to top-k / top-p, computed here
// by hand for four tokens.
#include <gtest/gtest.h>

#include <cmath>

#include "shardwise/core/error.h"
#include "shardwise/generate/sampling.h"

namespace shardwise::train {
namespace {

constexpr int kDraws = 20000;

std::vector<double> frequencies(const std::vector<float>& logits, const SamplingConfig& c, int64_t sequence = 0) {
  std::vector<double> f(logits.size(), 0.0);
  for (int64_t pos = 0; pos < kDraws; ++pos) f[static_cast<size_t>(choose_token(logits, c, sequence, pos))] += 1;
  for (double& x : f) x /= kDraws;
  return f;
}

// log(0.1), log(0.2), log(0.3), log(0.4): softmax at temperature 1 gives back 0.1 .. 0.4.
std::vector<float> four() { return {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)}; }

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    double se = std::sqrt(want[i] * (1 - want[i]) / kDraws);
    EXPECT_NEAR(got[i], want[i], 5 * se + 1e-12) << what << ": token " << i;
  }
}

SamplingConfig sample(double temperature, int64_t top_k = 0, double top_p = 1.0, uint64_t seed = 3) {
  SamplingConfig c;
  c.temperature = temperature, c.top_k = top_k, c.top_p = top_p, c.seed = seed;
  return c;
}

TEST(Sampling, GreedyIsTheArgmaxWithTheLowestIndexOnATie) {
  EXPECT_EQ(choose_token(four(), SamplingConfig{}, 0, 0), 3);
  std::vector<float> tie = {1, 5, 5, 2};
  EXPECT_EQ(choose_token(tie, SamplingConfig{}, 0, 0), 1);
  EXPECT_EQ(choose_token(tie, sample(1.0, 1), 0, 7), 1);  // top-k 1 is greedy too
}

TEST(Sampling, FrequenciesFollowTheSoftmaxOfLogitsOverTemperature) {
  expect_close(frequencies(four(), sample(1.0)), {0.1, 0.2, 0.3, 0.4}, "T=1");
  // T = 0.5 squares the probabilities: 1, 4, 9, 16 over 30.
  expect_close(frequencies(four(), sample(0.5)), {1 / 30., 4 / 30., 9 / 30., 16 / 30.}, "T=0.5");
}

TEST(Sampling, TopKAndTopPKeepTheMostLikelyTokensAndRenormalize) {
  expect_close(frequencies(four(), sample(1.0, 2)), {0, 0, 3 / 7., 4 / 7.}, "top-k 2");
  // 0.4 < 0.5 <= 0.4 + 0.3: the nucleus is the two most likely tokens.
  expect_close(frequencies(four(), sample(1.0, 0, 0.5)), {0, 0, 3 / 7., 4 / 7.}, "top-p 0.5");
  expect_close(frequencies(four(), sample(1.0, 0, 1e-6)), {0, 0, 0, 1}, "top-p tiny");
  // top-k 3 then top-p 0.9 of the renormalized (2, 3, 4) / 9: 4/9 + 3/9 < 0.9: all three kept.
  expect_close(frequencies(four(), sample(1.0, 3, 0.9)), {0, 2 / 9., 3 / 9., 4 / 9.}, "top-k 3, top-p 0.9");
}

TEST(Sampling, DrawsDependOnSeedSequenceAndPositionOnly) {
  const auto logits = four();
  auto draws = [&](uint64_t seed, int64_t sequence) {
    std::vector<int64_t> out;
    for (int64_t pos = 0; pos < 64; ++pos) out.push_back(choose_token(logits, sample(1.0, 0, 1.0, seed), sequence, pos));
    return out;
  };
  EXPECT_EQ(draws(3, 0), draws(3, 0));
  EXPECT_NE(draws(3, 0), draws(4, 0));
  EXPECT_NE(draws(3, 0), draws(3, 1));
}

TEST(Sampling, BadSettingsAreRefused) {
  EXPECT_THROW(sample(-1).validate(), Error);
  EXPECT_THROW(sample(1, -2).validate(), Error);
  EXPECT_THROW(sample(1, 0, 0).validate(), Error);
  EXPECT_THROW(sample(1, 0, 1.01).validate(), Error);
  EXPECT_NO_THROW(sample(0.7, 40, 0.95).validate());
}

}  // namespace
}  // namespace shardwise::train
