// Llama's Hugging Face layout without PyPI: tests/golden/hf/llama_tiny was written by
// tools/hf_parity.py (`make hf-golden`): a random-init LlamaForCausalLM (4 heads over 2 kv heads, an
// untied head) saved by save_pretrained, a token file of 17 tokens and transformers' loss on it.
// `--init-from` that directory gives transformers' loss within 1e-5 on every mesh; shardwise's own
// Llama checkpoints hold exactly transformers' keys and shapes, and resume on another mesh.
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

nlohmann::json expected() {
  std::ifstream f(kDir + "/llama_tiny_expected.json");
  return nlohmann::json::parse(f);
}

TrainConfig fine_tune(const std::string& mesh) {
  return golden_fine_tune(kDir + "/llama_tiny", kDir + "/llama_tokens.bin", mesh);
}

double first_loss(const std::string& mesh, const fs::path& from = kDir + "/llama_tiny") {
  return init_from_first_loss(fine_tune(mesh), from);
}

TEST(LlamaHf, TheFixtureIsATransformersLlamaWithGqaAndAnUntiedHead) {
  const GptConfig m = read_model_config(kDir + "/llama_tiny");
  EXPECT_TRUE(m.is_llama());
  EXPECT_EQ(m.key_value_heads(), 2);
  EXPECT_EQ(m.heads, 4);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.rope_theta, 10000.0);
}

TEST(LlamaHf, InitFromTransformersGivesItsLossOnEveryMesh) {
  const double want = expected()["loss"].get<double>();
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "pp=2", "tp=2,pp=2"}) {
    EXPECT_NEAR(first_loss(mesh), want, 1e-5 * want) << mesh;
  }
}

// A shardwise Llama checkpoint holds transformers' keys and shapes exactly (no key map: the
// parameters are stored as they are) and a LlamaConfig; started from the fixture and saved on
// tp=2, it loads back (--init-from) on pp=2 with transformers' loss.
TEST(LlamaHf, CheckpointsHoldTransformersKeysAndShapes) {
  const fs::path root = fs::temp_directory_path() / "sw_llama_hf_ckpt";
  fs::remove_all(root);
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(fine_tune("tp=2"), world);
    init_from_model(t, *world, kDir + "/llama_tiny");
    save_trainer(t, *world, root);
  });
  const fs::path dir = root / "checkpoint-0";
  std::ifstream cf(dir / "config.json");
  const nlohmann::json config = nlohmann::json::parse(cf);
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  std::map<std::string, Shape> theirs, ours;
  ckpt::SafetensorsFile file(kDir + "/llama_tiny/model.safetensors");
  for (const auto& t : file.tensors()) theirs[t.name] = t.shape;
  std::ifstream index(dir / "model.safetensors.index.json");
  const nlohmann::json weight_map = nlohmann::json::parse(index)["weight_map"];
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    ckpt::SafetensorsFile f(dir / it.value().get<std::string>());
    ours[it.key()] = f.info(it.key()).shape;
  }
  EXPECT_EQ(ours, theirs);
  EXPECT_TRUE(ours.contains("lm_head.weight"));
  EXPECT_TRUE(ours.contains("model.layers.1.self_attn.k_proj.weight"));
  const double want = expected()["loss"].get<double>();
  EXPECT_NEAR(first_loss("pp=2", dir), want, 1e-5 * want);
  fs::remove_all(root);
}

// Resumed on another mesh (tp=2 -> pp=2), a Llama run continues the uninterrupted curve.
TEST(LlamaHf, ResumeOnAnotherMeshContinuesTheCurve) {
  const fs::path root = fs::temp_directory_path() / "sw_llama_resume";
  fs::remove_all(root);
  TrainConfig c = fine_tune("tp=2");
  c.optimizer.steps = 4;
  const std::vector<double> whole = train_losses(c, 4, {}, {});
  train_losses(c, 2, {}, root);
  c.parallel.mesh = "pp=2";
  const std::vector<double> rest = train_losses(c, 2, root / "checkpoint-2", {});
  ASSERT_EQ(rest.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(rest[i], whole[i + 2], 1e-5 * whole[i + 2]) << "step " << i + 3;
  fs::remove_all(root);
}

TEST(LlamaHf, LlamaConfigsShardwiseCannotBuildExactlyAreRefused) {
  const fs::path dir = fs::temp_directory_path() / "sw_llama_configs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream f(kDir + "/llama_tiny/config.json");
  const nlohmann::json base = nlohmann::json::parse(f);
  auto refused = [&](const char* key, nlohmann::json value) { return config_refused(dir, base, key, value); };
  EXPECT_TRUE(refused("attention_bias", true));
  EXPECT_TRUE(refused("mlp_bias", true));
  EXPECT_TRUE(refused("hidden_act", "gelu"));
  EXPECT_TRUE(refused("head_dim", 3));  // odd: rotary halves the head (8, not hidden / heads, is built)
  EXPECT_FALSE(refused("head_dim", 8));
  EXPECT_TRUE(refused("rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e4}}));
  EXPECT_TRUE(refused("num_key_value_heads", 3));  // does not divide 4 heads
  EXPECT_FALSE(refused("head_dim", 4));
  // The earlier transformers form: rope_theta and rope_scaling at the top level.
  nlohmann::json old = base;
  old.erase("rope_parameters");
  old["rope_theta"] = 500000.0;
  old["rope_scaling"] = nullptr;
  std::ofstream(dir / "config.json") << old.dump();
  EXPECT_EQ(read_model_config(dir).rope_theta, 500000.0);
  old["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  std::ofstream(dir / "config.json") << old.dump();
  EXPECT_THROW(read_model_config(dir), Error);
  fs::remove_all(dir);
}

TEST(LlamaHf, AnotherModelIsRefusedNamingTheField) {
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig gpt = fine_tune("dp=1");
    gpt.model = GptConfig();
    gpt.model.layers = 2, gpt.model.heads = 4, gpt.model.hidden = 16, gpt.model.seq = 16, gpt.model.vocab = 128;
    Trainer t(gpt, world);
    try {
      init_from_model(t, *world, kDir + "/llama_tiny");
      ADD_FAILURE() << "a Llama loaded into GPT-2";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model_type 'llama' (directory) vs 'gpt2'"), std::string::npos) << e.what();
    }
    TrainConfig wide = fine_tune("dp=1");
    wide.model.kv_heads = 4;
    Trainer u(wide, world);
    try {
      init_from_model(u, *world, kDir + "/llama_tiny");
      ADD_FAILURE() << "another kv head count loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("num_key_value_heads 2 (directory) vs 4 (this run)"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace shardwise::train
