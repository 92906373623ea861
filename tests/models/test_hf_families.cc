// The Llama builder's Hugging Face families without PyPI: tests/golden/hf/qwen2_tiny and qwen3_tiny
// were written by tools/hf_families.py, mistral_tiny by tools/hf_families.py (`make hf-golden`): a
// random-init Qwen2ForCausalLM (hidden 24, 4 heads over 2 kv heads, random q/k/v biases, an untied
// head, rope_theta 1e6), Qwen3ForCausalLM (hidden 32, 4 heads over 1 kv head, head_dim 8, random q/k
// norm weights, a tied head, rope_theta 5e5) and MistralForCausalLM (hidden 16, 2 heads over 1 kv
// head, sliding_window null, rope_theta 2e4) saved by save_pretrained, a token file of 17 tokens each
// and transformers' loss on it. `--init-from` each directory gives transformers' loss within 1e-5
// on every mesh (tp shards the biases with their weights' rows; a single kv head and Qwen3's k_norm
// are replicated over tp); shardwise's checkpoints hold exactly transformers' keys and shapes and
// the family's config; what these builders cannot build (a used sliding window shorter than the
// sequence, Qwen3's attention biases) is refused by name. qwen3_hd_tiny is a Qwen3ForCausalLM whose
// head_dim 16 is not hidden / heads (48 / 4), as Qwen3-0.6B's 128 vs 1024 / 16: 4 heads over 2 kv
// heads, q_proj [64, 48], o_proj [48, 64], q/k norms [16], an untied head.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/models/model_io.h"
#include "shardwise/models/models.h"
#include "tests/support/config_checks.h"
#include "tests/support/llama_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

std::string model_dir(const std::string& name) { return kDir + "/" + name + "_tiny"; }

double want_loss(const std::string& name) {
  std::ifstream f(kDir + "/" + name + "_tiny_expected.json");
  return nlohmann::json::parse(f)["loss"].get<double>();
}

TrainConfig fine_tune(const std::string& name, const std::string& mesh) {
  return golden_fine_tune(model_dir(name), kDir + "/" + name + "_tokens.bin", mesh);
}

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

void expect_transformers_loss_on_every_mesh(const std::string& name) {
  const double want = want_loss(name);
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "pp=2", "tp=2,pp=2"}) {
    EXPECT_NEAR(init_from_first_loss(fine_tune(name, mesh), model_dir(name)), want, 1e-5 * want) << name << " " << mesh;
  }
}

// Started from the fixture and saved on tp=2: the checkpoint's config.json (returned) and its keys
// and shapes are transformers', and it loads back on pp=2 with transformers' loss.
nlohmann::json expect_checkpoint_is_transformers(const std::string& name, const std::string& key) {
  const fs::path root = fs::temp_directory_path() / ("sw_" + name + "_hf_ckpt");
  fs::remove_all(root);
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(fine_tune(name, "tp=2"), world);
    init_from_model(t, *world, model_dir(name));
    save_trainer(t, *world, root);
  });
  const fs::path dir = root / "checkpoint-0";
  std::ifstream cf(dir / "config.json");
  const nlohmann::json config = nlohmann::json::parse(cf);
  const std::map<std::string, Shape> ours = stored_shapes(dir), theirs = stored_shapes(model_dir(name));
  EXPECT_EQ(ours, theirs);
  EXPECT_TRUE(ours.contains(key)) << key;
  const double want = want_loss(name);
  EXPECT_NEAR(init_from_first_loss(fine_tune(name, "pp=2"), dir), want, 1e-5 * want);
  fs::remove_all(root);
  return config;
}

TEST(HfFamilies, TheFixturesAreAQwen2WithBiasesAQwen3WithQkNormsAndAMistral) {
  const GptConfig q2 = read_model_config(model_dir("qwen2"));
  EXPECT_TRUE(q2.is_llama());
  EXPECT_EQ(q2.family, "qwen2");
  EXPECT_TRUE(q2.qkv_bias());
  EXPECT_EQ(q2.key_value_heads(), 2);
  EXPECT_FALSE(q2.tie_word_embeddings);
  EXPECT_EQ(q2.rope_theta, 1e6);
  const GptConfig q3 = read_model_config(model_dir("qwen3"));
  EXPECT_EQ(q3.family, "qwen3");
  EXPECT_FALSE(q3.qkv_bias());
  EXPECT_EQ(q3.key_value_heads(), 1);
  EXPECT_TRUE(q3.tie_word_embeddings);
  EXPECT_EQ(q3.rope_theta, 5e5);
  const GptConfig q3hd = read_model_config(model_dir("qwen3_hd"));
  EXPECT_EQ(q3hd.family, "qwen3");
  EXPECT_EQ(q3hd.head_size(), 16);
  EXPECT_NE(q3hd.head_size(), q3hd.hidden / q3hd.heads);
  EXPECT_EQ(q3hd.key_value_heads(), 2);
  for (const std::string name : {"qwen2", "qwen3", "qwen3_hd", "mistral"}) {  // the run header's count
    double stored = 0;
    for (const auto& [key, shape] : stored_shapes(model_dir(name))) stored += static_cast<double>(shape.numel());
    EXPECT_EQ(parameter_count(read_model_config(model_dir(name))), stored) << name;
  }
  const GptConfig mistral = read_model_config(model_dir("mistral"));
  EXPECT_EQ(mistral.family, "mistral");
  EXPECT_EQ(mistral.sliding_window, 0);
  EXPECT_EQ(mistral.rope_theta, 2e4);
}

TEST(HfFamilies, Qwen2InitFromTransformersGivesItsLossOnEveryMesh) { expect_transformers_loss_on_every_mesh("qwen2"); }
TEST(HfFamilies, Qwen3InitFromTransformersGivesItsLossOnEveryMesh) { expect_transformers_loss_on_every_mesh("qwen3"); }
TEST(HfFamilies, Qwen3WithHeadDimNotHiddenOverHeadsGivesTransformersLossOnEveryMesh) {
  expect_transformers_loss_on_every_mesh("qwen3_hd");
}

TEST(HfFamilies, Qwen2CheckpointsHoldTransformersKeysAndAQwen2Config) {
  const nlohmann::json config = expect_checkpoint_is_transformers("qwen2", "model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(config["rope_theta"], 1e6);
  EXPECT_EQ(config["use_sliding_window"], false);
}

TEST(HfFamilies, Qwen3CheckpointsHoldTransformersKeysAndAQwen3Config) {
  const nlohmann::json config = expect_checkpoint_is_transformers("qwen3", "model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["tie_word_embeddings"], true);
}

// Saved from the head_dim 16 fixture: transformers' shapes (q_proj [64, 48], o_proj [48, 64], q/k
// norms [16]) and config.json's head_dim 16, read back as the same model.
TEST(HfFamilies, Qwen3WithHeadDimSavesItsShapesAndHeadDim) {
  const nlohmann::json config = expect_checkpoint_is_transformers("qwen3_hd", "model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["head_dim"], 16);
  EXPECT_EQ(config["hidden_size"], 48);
  const std::map<std::string, Shape> shapes = stored_shapes(model_dir("qwen3_hd"));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.weight"), (Shape{64, 48}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.o_proj.weight"), (Shape{48, 64}));
}

nlohmann::json fixture_config(const std::string& name) {
  std::ifstream f(model_dir(name) + "/config.json");
  return nlohmann::json::parse(f);
}

TEST(HfFamilies, AUsedSlidingWindowIsRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / "sw_qwen_configs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const std::string name : {"qwen2", "qwen3"}) {
    nlohmann::json base = fixture_config(name);
    base["sliding_window"] = 8;  // shorter than max_position_embeddings 16
    EXPECT_FALSE(config_refused(dir, base, "use_sliding_window", false)) << name;
    base["use_sliding_window"] = true;
    std::ofstream(dir / "config.json") << base.dump();
    try {
      read_model_config(dir);
      ADD_FAILURE() << name << ": a sliding window of 8 over sequences of 16 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sliding_window = 8 is not supported"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(config_refused(dir, base, "sliding_window", 16)) << name;  // a window covering the sequence
  }
  fs::remove_all(dir);
}

TEST(HfFamilies, MistralInitFromTransformersGivesItsLossOnEveryMesh) {
  expect_transformers_loss_on_every_mesh("mistral");
}

TEST(HfFamilies, MistralCheckpointsHoldTransformersKeysAndAMistralConfig) {
  const nlohmann::json config = expect_checkpoint_is_transformers("mistral", "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(config["model_type"], "mistral");
  EXPECT_EQ(config["architectures"][0], "MistralForCausalLM");
  EXPECT_TRUE(config["sliding_window"].is_null());
  EXPECT_FALSE(config.contains("attention_bias"));
}

// Mistral-7B-v0.1's sliding_window is 4096: a run on sequences no longer than the window is exact
// (full causal attention is the windowed one there); a longer sequence is refused naming both.
TEST(HfFamilies, AMistralWindowShorterThanTheSequenceIsRefusedNamingBoth) {
  const fs::path dir = fs::temp_directory_path() / "sw_mistral_window";
  fs::remove_all(dir);
  fs::copy(model_dir("mistral"), dir, fs::copy_options::recursive);
  nlohmann::json config = fixture_config("mistral");
  config["sliding_window"] = 8;
  std::ofstream(dir / "config.json") << config.dump();
  TrainConfig c = golden_fine_tune(dir.string(), kDir + "/mistral_tokens.bin", "dp=1");
  EXPECT_EQ(c.model.sliding_window, 8);
  try {
    init_from_first_loss(c, dir);
    ADD_FAILURE() << "a window of 8 over sequences of 16 trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window 8 is shorter than the sequence length 16"), std::string::npos)
        << e.what();
  }
  c.model.seq = 8;
  EXPECT_TRUE(std::isfinite(init_from_first_loss(c, dir)));
  fs::remove_all(dir);
}

// Qwen3's head_dim is its own field (128 in Qwen3-0.6B's 1024 / 16 heads) and is built as given;
// one rotary cannot halve, or not a positive integer, is refused by name; so are Qwen3's optional
// attention biases.
TEST(HfFamilies, Qwen3ConfigsShardwiseCannotBuildAreRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / "sw_qwen3_configs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const nlohmann::json base = fixture_config("qwen3");
  EXPECT_FALSE(config_refused(dir, base, "head_dim", 16));
  EXPECT_FALSE(config_refused(dir, base, "head_dim", 8));
  EXPECT_EQ(read_model_config(dir).head_size(), 8);
  EXPECT_TRUE(config_refused(dir, base, "head_dim", 0));
  EXPECT_TRUE(config_refused(dir, base, "head_dim", 15));
  EXPECT_TRUE(config_refused(dir, base, "attention_bias", true));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardwise::train
