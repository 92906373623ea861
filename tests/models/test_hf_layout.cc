// GPT-2's layout on disk (models/model_io.h): config.json is a GPT2Config, the keys are GPT-2's, and
// attn.c_attn holds q|k|v side by side in Conv1D [in, out] layout. The fused tensor is checked
// against the gathered q, k, v parameters concatenated here; checkpoints of the earlier layout
// (separate q/k/v keys), made here from a new one by splitting c_attn, still resume the same run.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/models/model_io.h"
#include "tests/support/config_checks.h"
#include "tests/support/small_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-hf-" + name);
  fs::remove_all(d);
  return d;
}

// Trains `steps` steps on `mesh` (after loading `from`), saves into `root`; the losses, and the
// gathered parameters when asked.
std::vector<double> train(const std::string& mesh, int64_t steps, const fs::path& from, const fs::path& root,
                          std::map<std::string, Tensor>* params = nullptr) {
  return train_losses(small_config(mesh, 16), steps, from, root, params);
}

// Columns [c0, c0 + n) of a [rows, cols] matrix, or elements of a vector.
Tensor columns(const Tensor& t, int64_t c0, int64_t n) {
  if (t.ndim() == 1) return t.slice(std::vector<int64_t>{c0}, Shape{n});
  return t.slice(std::vector<int64_t>{0, c0}, Shape{t.shape()[0], n});
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(HfLayout, ConfigIsGpt2ConfigAndCAttnIsQKVFused) {
  fs::path root = fresh_dir("fused");
  std::map<std::string, Tensor> params;
  train("dp=2,tp=2", 2, {}, root, &params);
  fs::path dir = ckpt::find_resume(root)->dir;
  nlohmann::json config = ckpt::load_json(dir, "config.json");
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["n_embd"], 32);
  EXPECT_EQ(config["vocab_size"], 128);
  for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) EXPECT_EQ(config[id], 10) << id;
  ckpt::GroupReader model(dir, "model");
  std::set<std::string> keys(model.names().begin(), model.names().end());
  std::set<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                                "transformer.ln_f.bias"};
  for (int l = 0; l < 2; ++l) {
    for (const char* k : {"ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}) {
      want.insert(fmt::format("transformer.h.{}.{}.weight", l, k));
      want.insert(fmt::format("transformer.h.{}.{}.bias", l, k));
    }
  }
  EXPECT_EQ(keys, want);
  const int64_t H = 32;
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("transformer.h.{}.attn.", l);
    for (const char* suffix : {"weight", "bias"}) {
      Tensor fused = model.file_of(p + "c_attn." + suffix).read(p + "c_attn." + suffix);
      int64_t i = 0;
      for (const char* part : {"q_proj", "k_proj", "v_proj"}) {
        EXPECT_TRUE(bit_equal(columns(fused, i * H, H), params.at(p + part + "." + suffix))) << p << part << suffix;
        ++i;
      }
    }
    EXPECT_EQ(model.info(p + "c_attn.weight").shape, (Shape{H, 3 * H}));  // Conv1D: [in, out]
  }
  // The moments are fused the same way.
  ckpt::GroupReader optimizer(dir, "optimizer");
  EXPECT_TRUE(optimizer.contains("transformer.h.0.attn.c_attn.weight/exp_avg"));
  EXPECT_FALSE(optimizer.contains("transformer.h.0.attn.q_proj.weight/exp_avg"));
}

// Rewrites a checkpoint's model and optimizer groups into the earlier layout: c_attn (and its
// moments) split into q_proj/k_proj/v_proj, one file per group, model_type shardwise_gpt.
void make_legacy(const fs::path& dir, int64_t hidden) {
  for (const char* group : {"model", "optimizer"}) {
    std::vector<ckpt::StEntry> entries;
    std::vector<Tensor> keep;
    {
      ckpt::GroupReader g(dir, group);
      for (const std::string& key : g.names()) {
        Tensor t = g.file_of(key).read(key);
        const size_t at = key.find("c_attn.");
        if (at == std::string::npos) {
          keep.push_back(t);
          entries.push_back(ckpt::entry_of(key, keep.back()));
          continue;
        }
        int64_t i = 0;
        for (const char* part : {"q_proj.", "k_proj.", "v_proj."}) {
          keep.push_back(columns(t, i++ * hidden, hidden));
          entries.push_back(ckpt::entry_of(key.substr(0, at) + part + key.substr(at + 7), keep.back()));
        }
      }
      for (const std::string& f : g.file_names()) fs::remove(dir / f);
    }
    fs::remove(dir / ckpt::index_file_name(group));
    ckpt::write_safetensors(dir / ckpt::single_file_name(group), entries, ckpt::StMetadata{{"format", "pt"}});
  }
  nlohmann::json config = ckpt::load_json(dir, "config.json");
  config["model_type"] = "shardwise_gpt";
  config["architectures"] = {"ShardwiseGPT"};
  std::ofstream(dir / "config.json") << config.dump(2);
}

TEST(HfLayout, CheckpointsOfTheEarlierLayoutStillResume) {
  const std::vector<double> whole = train("dp=2", 6, {}, {});
  fs::path root = fresh_dir("legacy");
  train("dp=2", 3, {}, root);
  fs::path dir = ckpt::find_resume(root)->dir;
  make_legacy(dir, 32);
  ASSERT_TRUE(is_legacy_layout(dir));
  ckpt::GroupReader legacy(dir, "model");
  ASSERT_TRUE(legacy.contains("transformer.h.1.attn.v_proj.bias"));
  const std::vector<double> rest = train("tp=2", 3, dir, {});
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_NEAR(rest[i], whole[3 + i], 1e-5 * whole[3 + i]) << i;
}

TEST(HfLayout, ConfigsShardwiseCannotBuildExactlyAreRefused) {
  fs::path dir = fresh_dir("configs");
  fs::create_directories(dir);
  GptConfig m = small_config("dp=1", 1).model;
  auto refused = [&](const char* key, nlohmann::json value) {
    return config_refused(dir, gpt2_config_json(m, DType::F32, default_special_tokens(m.vocab)), key, value);
  };
  EXPECT_TRUE(refused("model_type", "phi3"));  // (llama, mistral, qwen2/3 are read as LlamaConfigs: test_llama_hf.cc)
  EXPECT_TRUE(refused("n_inner", 100));
  EXPECT_TRUE(refused("tie_word_embeddings", false));
  EXPECT_TRUE(refused("activation_function", "relu"));
  EXPECT_TRUE(refused("scale_attn_by_inverse_layer_idx", true));
  EXPECT_FALSE(refused("n_inner", 4 * m.hidden));
  EXPECT_EQ(read_model_config(dir).hidden, m.hidden);
}

}  // namespace
}  // namespace shardwise::train
