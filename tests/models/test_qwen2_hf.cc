// Qwen2 without PyPI: tests/golden/hf/qwen2_tiny was written by tools/hf_qwen.py (`make hf-golden`):
// a random-init Qwen2ForCausalLM (hidden 24, 4 heads over 2 kv heads, random q/k/v biases, an untied
// head, rope_theta 1e6) saved by save_pretrained, a token file of 17 tokens and transformers' loss on
// it. `--init-from` that directory gives transformers' loss within 1e-5 on every mesh (tp shards the
// biases with their weights' rows); shardwise's checkpoints of it hold exactly transformers' keys
// and shapes and a Qwen2Config; a Qwen2 whose sliding window is used is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/models/model_io.h"
#include "tests/support/config_checks.h"
#include "tests/support/llama_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";
const std::string kModel = kDir + "/qwen2_tiny";

double want_loss() {
  std::ifstream f(kDir + "/qwen2_tiny_expected.json");
  return nlohmann::json::parse(f)["loss"].get<double>();
}

TrainConfig fine_tune(const std::string& mesh) { return golden_fine_tune(kModel, kDir + "/qwen2_tokens.bin", mesh); }

std::map<std::string, Shape> stored_shapes(const fs::path& dir) {
  std::map<std::string, Shape> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with("model") || entry.path().extension() != ".safetensors") continue;  // not the optimizer's
    ckpt::SafetensorsFile f(entry.path());
    for (const auto& t : f.tensors()) out[t.name] = t.shape;
  }
  return out;
}

TEST(Qwen2Hf, TheFixtureIsAQwen2WithBiasesGqaAndItsRopeTheta) {
  const GptConfig m = read_model_config(kModel);
  EXPECT_TRUE(m.is_llama());
  EXPECT_EQ(m.family, "qwen2");
  EXPECT_TRUE(m.qkv_bias());
  EXPECT_EQ(m.key_value_heads(), 2);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.rope_theta, 1e6);
}

TEST(Qwen2Hf, InitFromTransformersGivesItsLossOnEveryMesh) {
  const double want = want_loss();
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "pp=2", "tp=2,pp=2"}) {
    EXPECT_NEAR(init_from_first_loss(fine_tune(mesh), kModel), want, 1e-5 * want) << mesh;
  }
}

// Saved on tp=2 (the biases sharded with q/k/v's rows), the checkpoint is a Qwen2Config with
// transformers' keys and shapes, biases included, and loads back on pp=2 with transformers' loss.
TEST(Qwen2Hf, CheckpointsHoldTransformersKeysAndAQwen2Config) {
  const fs::path root = fs::temp_directory_path() / "sw_qwen2_hf_ckpt";
  fs::remove_all(root);
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(fine_tune("tp=2"), world);
    init_from_model(t, *world, kModel);
    save_trainer(t, *world, root);
  });
  const fs::path dir = root / "checkpoint-0";
  std::ifstream cf(dir / "config.json");
  const nlohmann::json config = nlohmann::json::parse(cf);
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(config["rope_theta"], 1e6);
  EXPECT_EQ(config["use_sliding_window"], false);
  const std::map<std::string, Shape> ours = stored_shapes(dir), theirs = stored_shapes(kModel);
  EXPECT_EQ(ours, theirs);
  EXPECT_TRUE(ours.contains("model.layers.1.self_attn.k_proj.bias"));
  const double want = want_loss();
  EXPECT_NEAR(init_from_first_loss(fine_tune("pp=2"), dir), want, 1e-5 * want);
  fs::remove_all(root);
}

TEST(Qwen2Hf, AUsedSlidingWindowIsRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / "sw_qwen2_configs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream f(kModel + "/config.json");
  nlohmann::json base = nlohmann::json::parse(f);
  base["sliding_window"] = 8;  // shorter than max_position_embeddings 16
  EXPECT_FALSE(config_refused(dir, base, "use_sliding_window", false));
  base["use_sliding_window"] = true;
  std::ofstream(dir / "config.json") << base.dump();
  try {
    read_model_config(dir);
    ADD_FAILURE() << "a sliding window of 8 over sequences of 16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window = 8 is not supported"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(config_refused(dir, base, "sliding_window", 16));  // a window covering the sequence
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardwise::train
