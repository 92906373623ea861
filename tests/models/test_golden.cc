// shardwise's GPT trainer reproduces PyTorch's per-step losses (tests/golden/gpt_losses.json,
// written by tests/golden/gpt_parity.py from shardwise's exported initial weights and batches;
// `make golden` regenerates it) within 1e-4 relative, on one rank and on dp=2 x tp=2.
#include <gtest/gtest.h>

#include "tests/support/golden_losses.h"

namespace shardwise::train {
namespace {

TEST(Golden, LossesMatchPyTorchWithinOneInTenThousand) {
  expect_golden_losses(golden_losses("gpt_losses.json", "golden"), golden::parity_config(),
                       {{"dp=1", 1}, {"dp=2,tp=2", 4}}, "PyTorch");
}

}  // namespace
}  // namespace shardwise::train
