// shardwise's Llama reproduces transformers' LlamaForCausalLM per-step losses
// (tests/golden/llama_losses.json, written by tests/golden/llama_parity.py from shardwise's exported
// initial weights and batches; `make llama-golden` regenerates it) within 1e-4 relative, on one rank
// and on dp=2 x tp=2; the MoE Llama those of transformers' MixtralForCausalLM (the same script;
// tests/golden/moe_losses.json, `make moe-golden`) on one rank and on dp=2 x ep=2.
#include <gtest/gtest.h>

#include "tests/support/golden_losses.h"

namespace shardwise::train {
namespace {

TEST(LlamaGolden, LossesMatchTransformersWithinOneInTenThousand) {
  expect_golden_losses(golden_losses("llama_losses.json", "llama-golden"), golden::llama_parity_config(),
                       {{"dp=1", 1}, {"dp=2,tp=2", 4}}, "transformers");
}

// The MoE Llama (4 experts, top-2, aux and z losses) against transformers' MixtralSparseMoeBlock.
TEST(LlamaGolden, MoeLossesMatchTransformersMixtralWithinOneInTenThousand) {
  expect_golden_losses(golden_losses("moe_losses.json", "moe-golden"), golden::moe_parity_config(),
                       {{"dp=1", 1}, {"dp=2,ep=2", 4}}, "transformers' Mixtral");
}

}  // namespace
}  // namespace shardwise::train
