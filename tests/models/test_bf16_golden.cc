// shardwise's GPT-2 with --compute bf16 (unfused attention and head) follows PyTorch's CPU autocast
// to bf16 on the same model, weights and batches (tests/golden/gpt_bf16_losses.json, written by
// tests/golden/bf16_autocast_parity.py; `make bf16-golden` regenerates it).
//
// The first step (the same weights: only the forward's rounding differs) within 1e-6 relative of
// autocast's on one rank (measured 1e-7), where PyTorch's f32 loss (tests/golden/gpt_losses.json)
// is 1.9e-5 away: the bf16 roundings are autocast's. The 20 steps within 1e-3, on one rank and on
// dp=2 x tp=2: both round the same operands and products to bf16, but their GEMMs sum the f32
// products in other orders (OpenBLAS's blocking against oneDNN's), so a product near a rounding
// boundary now and then rounds to the neighbouring bf16 value (2^-8 apart), and the updates carry
// it on (measured: 2e-4 at most; autocast's own curve is 3.5e-4 from the f32 one in this small
// model, so after the first step the curves alone cannot tell bf16 from f32).
#include <gtest/gtest.h>

#include "tests/support/golden_losses.h"

namespace shardwise::train {
namespace {

TEST(Bf16Golden, FirstStepIsAutocastsToOneInAMillion) {
  const double autocast = golden_losses("gpt_bf16_losses.json", "bf16-golden")["losses"][0];
  const double f32 = golden_losses("gpt_losses.json", "golden")["losses"][0];
  train::TrainConfig c = golden::bf16_parity_config();
  c.optimizer.steps = 1;
  const double ours = run_losses(c, 1)[0];
  EXPECT_NEAR(ours, autocast, 1e-6 * autocast);
  EXPECT_GT(std::abs(f32 - autocast), 10e-6 * autocast) << "the golden files should differ at the first step";
}

TEST(Bf16Golden, LossesFollowPyTorchAutocastBf16) {
  const nlohmann::json g = golden_losses("gpt_bf16_losses.json", "bf16-golden");
  expect_golden_losses(g, golden::bf16_parity_config(), {{"dp=1", 1}, {"dp=2,tp=2", 4}}, "PyTorch autocast bf16",
                       1e-3);
}

}  // namespace
}  // namespace shardwise::train
