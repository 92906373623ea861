// shardwise's Llama reproduces transformers' LlamaForCausalLM per-step losses
// (tests/golden/llama_losses.json, written by tests/golden/llama_parity.py from shardwise's exported
// initial weights and batches; `make llama-golden` regenerates it) within 1e-4 relative, on one rank
// and on dp=2 x tp=2; the MoE Llama those of transformers' MixtralForCausalLM (the same script;
// tests/golden/moe_losses.json, `make moe-golden`) on one rank and on dp=2 x ep=2.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include "shardwise/comm/local.h"
#include "tests/golden/parity_config.h"

namespace shardwise::train {
namespace {

nlohmann::json golden(const std::string& file = "llama_losses.json") {
  std::ifstream f(std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/" + file);
  EXPECT_TRUE(f.good()) << "tests/golden/" << file << " is missing: run `make llama-golden` / `make moe-golden`";
  return nlohmann::json::parse(f);
}

std::vector<double> run(TrainConfig c, int ranks) {
  std::vector<double> losses;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int64_t s = 0; s < c.steps; ++s) {
      double l = t.step().loss;
      if (w.rank() == 0) losses.push_back(l);
    }
  });
  return losses;
}

void expect_golden(const nlohmann::json& g, TrainConfig c, const std::vector<std::pair<std::string, int>>& meshes) {
  ASSERT_EQ(g["config"], golden::parity_config_json(c)) << "the golden file was made for another configuration";
  std::vector<double> want = g["losses"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<int64_t>(want.size()), c.steps);
  for (auto [mesh, ranks] : meshes) {
    c.mesh = mesh;
    std::vector<double> got = run(c, ranks);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << mesh << ": step " << i + 1;
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    }
    std::cout << "largest relative difference from transformers on " << mesh << ": " << worst << "\n";
  }
  EXPECT_LT(want.back(), want.front()) << "the reference run should learn";
}

TEST(LlamaGolden, LossesMatchTransformersWithinOneInTenThousand) {
  expect_golden(golden(), golden::llama_parity_config(), {{"dp=1", 1}, {"dp=2,tp=2", 4}});
}

// The MoE Llama (4 experts, top-2, aux and z losses) against transformers' MixtralSparseMoeBlock.
TEST(LlamaGolden, MoeLossesMatchTransformersMixtralWithinOneInTenThousand) {
  expect_golden(golden("moe_losses.json"), golden::moe_parity_config(), {{"dp=1", 1}, {"dp=2,ep=2", 4}});
}

}  // namespace
}  // namespace shardwise::train
