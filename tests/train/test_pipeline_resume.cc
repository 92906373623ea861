// Checkpoints hold global tensors whatever the pipeline: saved on pp=2 x dp=2 they load on a mesh
// without pp (and the other way round) and training continues the uninterrupted loss curve.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/pipeline_config.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/comm/local.h"
#include "shardwise/train/checkpointing.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

std::vector<double> train(const std::string& mesh, int64_t steps, const fs::path& from, const fs::path& save_to) {
  TrainConfig c = pipeline_test_config(mesh);
  c.optimizer.steps = 16;
  return train_losses(c, steps, from, save_to);
}

fs::path fresh(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-pp-resume-" + name);
  fs::remove_all(d);
  return d;
}

void expect_continues(const std::vector<double>& rest, const std::vector<double>& whole, const std::string& what) {
  ASSERT_EQ(rest.size(), 8u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_NEAR(rest[i], whole[8 + i], 1e-5 * whole[8 + i]) << what << ", step " << 9 + i;
}

TEST(PipelineResume, SavedWithPpLoadsWithoutPpAndBack) {
  std::vector<double> whole = train("dp=1", 16, {}, {});
  fs::path a = fresh("from-pp");
  train("pp=2,dp=2", 8, {}, a);
  fs::path dir = ckpt::find_resume(a)->dir;
  // The model group holds every parameter once (the tied embedding too) as a whole tensor.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  // GPT-2's 12 keys per layer (q/k/v fused in c_attn); wte, wpe; ln_f weight and bias.
  EXPECT_EQ(index["weight_map"].size(), 4u * 12 + 4);
  EXPECT_TRUE(index["weight_map"].contains("transformer.h.3.attn.c_attn.weight"));
  expect_continues(train("tp=2", 8, dir, {}), whole, "saved on pp=2,dp=2, resumed on tp=2");
  expect_continues(train("pp=4", 8, dir, {}), whole, "saved on pp=2,dp=2, resumed on pp=4");
  fs::path b = fresh("to-pp");
  train("dp=2", 8, {}, b);
  expect_continues(train("pp=2,tp=2", 8, ckpt::find_resume(b)->dir, {}), whole, "saved on dp=2, resumed on pp=2,tp=2");
}

}  // namespace
}  // namespace shardwise::train
