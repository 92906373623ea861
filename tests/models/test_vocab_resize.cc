// Tokens added to a tokenizer grow the model's vocabulary (train/vocab_resize.h). The fixture
// tests/golden/hf/resize_llama_tiny was written by tools/hf_resize_vocab.py: a random-init
// LlamaForCausalLM of vocabulary 99 with an untied head, saved with a tokenizer to which two special
// tokens were added (ids 99 and 100), and resize_llama_tiny_expected.json holds transformers' loss
// of shardwise's grown checkpoint on 17 tokens that use the added ids, and transformers' own
// resize_token_embeddings(101) added rows. The draw's statistics are checked against the exact
// formula computed here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/train/vocab_resize.h"
#include "shardwise/models/model_io.h"
#include "tests/support/llama_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";
const std::string kModel = kDir + "/resize_llama_tiny";

nlohmann::json expected() {
  std::ifstream f(kDir + "/resize_llama_tiny_expected.json");
  return nlohmann::json::parse(f);
}

// The fixture grown to its tokenizer's 101 ids, as `train --init-from` configures it.
TrainConfig grown(const std::string& mesh) {
  TrainConfig c = golden_fine_tune(kModel, kDir + "/resize_tokens.bin", mesh);
  c.init_vocab = c.model.vocab;
  c.model.vocab = tokenizer_ids(kModel);
  return c;
}

// Old rows [V, H]: column j is 0.1 j + (j + 1) x a standard normal, plus column 0 in column 2
// (a correlation the covariance must carry).
Tensor old_rows(int64_t V, int64_t H) {
  Tensor t(DType::F32, Shape{V, H});
  const Philox rng(5, 9);
  for (int64_t i = 0; i < V; ++i)
    for (int64_t j = 0; j < H; ++j)
      t.data<float>()[i * H + j] = static_cast<float>(0.1 * j + (j + 1) * rng.normal(static_cast<uint64_t>(i * H + j)));
  for (int64_t i = 0; i < V; ++i) t.data<float>()[i * H + 2] += t.data<float>()[i * H];
  return t;
}

// Mean (per column) and covariance (divided by the row count) of `t`'s rows, in double.
std::pair<std::vector<double>, std::vector<double>> moments(const Tensor& t, const std::vector<double>* around = nullptr) {
  const int64_t V = t.shape()[0], H = t.shape()[1];
  std::vector<double> mean(static_cast<size_t>(H)), cov(static_cast<size_t>(H * H));
  for (int64_t i = 0; i < V; ++i)
    for (int64_t j = 0; j < H; ++j) mean[static_cast<size_t>(j)] += t.data<float>()[i * H + j] / static_cast<double>(V);
  const std::vector<double>& m = around ? *around : mean;
  for (int64_t i = 0; i < V; ++i)
    for (int64_t a = 0; a < H; ++a)
      for (int64_t b = 0; b < H; ++b)
        cov[static_cast<size_t>(a * H + b)] += (t.data<float>()[i * H + a] - m[static_cast<size_t>(a)]) *
                                               (t.data<float>()[i * H + b] - m[static_cast<size_t>(b)]) / static_cast<double>(V);
  return {mean, cov};
}

TEST(VocabResize, AddedRowsHaveTheOldRowsMeanAndTheirCovarianceTimes1e9) {
  const int64_t V = 64, H = 4, added = 20000;
  const Tensor old = old_rows(V, H);
  const auto [mu, sigma] = moments(old);
  const Tensor rows = mean_resized_rows(old, added, 1234, "model.embed_tokens.weight");
  ASSERT_EQ(rows.shape(), (Shape{added, H}));
  const auto [m, c] = moments(rows, &mu);  // around the old mean: a wrong mean shows in both
  for (int64_t a = 0; a < H; ++a) {
    const double sd = std::sqrt(1e-9 * sigma[static_cast<size_t>(a * H + a)]);
    EXPECT_NEAR(m[static_cast<size_t>(a)], mu[static_cast<size_t>(a)], 5 * sd / std::sqrt(double(added))) << a;
    for (int64_t b = 0; b < H; ++b) {
      const double scale = 1e-9 * std::sqrt(sigma[static_cast<size_t>(a * H + a)] * sigma[static_cast<size_t>(b * H + b)]);
      EXPECT_NEAR(c[static_cast<size_t>(a * H + b)], 1e-9 * sigma[static_cast<size_t>(a * H + b)], 0.05 * scale)
          << a << "," << b;
    }
  }
}

TEST(VocabResize, TheDrawIsKeyedBySeedAndNameAndWithoutAPositiveDefiniteCovarianceIsTheMean) {
  const Tensor old = old_rows(16, 3);
  auto same = [](const Tensor& a, const Tensor& b) {
    return std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>());
  };
  EXPECT_TRUE(same(mean_resized_rows(old, 3, 7, "w"), mean_resized_rows(old, 3, 7, "w")));
  EXPECT_FALSE(same(mean_resized_rows(old, 3, 7, "w"), mean_resized_rows(old, 3, 8, "w")));
  EXPECT_FALSE(same(mean_resized_rows(old, 3, 7, "w"), mean_resized_rows(old, 3, 7, "lm_head.weight")));
  Tensor flat = old;  // a constant column: the covariance is singular, transformers then takes the mean
  for (int64_t i = 0; i < 16; ++i) flat.data<float>()[i * 3 + 1] = 0.25f;
  const std::vector<double> mu = moments(flat).first;
  const Tensor rows = mean_resized_rows(flat, 2, 7, "w");
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(rows.data<float>()[k * 3 + j], static_cast<float>(mu[static_cast<size_t>(j)]));
}

TEST(VocabResize, TheTokenizerIdsCountTheAddedTokensOfEveryTokenizerFile) {
  EXPECT_EQ(tokenizer_ids(kModel), 101);  // tokenizer.json: 99 words and 2 added tokens
  EXPECT_EQ(read_model_config(kModel).vocab, 99);
  EXPECT_EQ(tokenizer_ids(kDir + "/llama_tiny"), 0);  // no tokenizer files
  const fs::path dir = fs::temp_directory_path() / "sw_vocab_resize_ids";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "added_tokens.json") << R"({"<|im_start|>": 140, "<|im_end|>": 139})";
  EXPECT_EQ(tokenizer_ids(dir), 141);
  std::ofstream(dir / "tokenizer_config.json") << R"({"added_tokens_decoder": {"150": {"content": "<x>"}}})";
  EXPECT_EQ(tokenizer_ids(dir), 151);
  std::ofstream(dir / "added_tokens.json") << "{not json";
  try {
    tokenizer_ids(dir);
    ADD_FAILURE() << "a broken added_tokens.json was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("added_tokens.json' is not a JSON file"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(VocabResize, TheGrownModelGivesTransformersLossOfItsCheckpointOnEveryMesh) {
  const double want = expected()["loss"].get<double>();
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "pp=2", "tp=2,pp=2"})
    EXPECT_NEAR(init_from_first_loss(grown(mesh), kModel), want, 1e-5 * want) << mesh;
}

// The tensor `key` of model directory `dir`'s weights.
std::vector<float> stored(const fs::path& dir, const std::string& key) {
  const Tensor t = ckpt::GroupReader(dir, "model").file_of(key).read(key);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(VocabResize, TheCheckpointKeepsTheOldRowsHoldsTheAddedOnesAndResumesOnAnotherMesh) {
  const fs::path root = fs::temp_directory_path() / "sw_vocab_resize_ckpt";
  fs::remove_all(root);
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(grown("tp=2"), world);
    init_from_model(t, *world, kModel);
    save_trainer(t, *world, root);
  });
  const fs::path dir = root / "checkpoint-0";
  std::ifstream cf(dir / "config.json");
  EXPECT_EQ(nlohmann::json::parse(cf)["vocab_size"], 101);
  const nlohmann::json want = expected();
  const int64_t H = 16;
  for (auto [key, theirs] : {std::pair{"model.embed_tokens.weight", "transformers_added_embed"},
                             std::pair{"lm_head.weight", "transformers_added_head"}}) {
    const std::vector<float> ours = stored(dir, key), base = stored(kModel, key);
    ASSERT_EQ(ours.size(), static_cast<size_t>(101 * H)) << key;
    EXPECT_TRUE(std::equal(base.begin(), base.end(), ours.begin())) << key << ": the old rows changed";
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t j = 0; j < H; ++j)
        EXPECT_NEAR(ours[static_cast<size_t>((99 + k) * H + j)], want[theirs][k][j].get<double>(), 1e-5) << key;
  }
  TrainConfig resumed = grown("pp=2");
  resumed.init_vocab = 0;  // a checkpoint of the grown model: nothing grows any more
  EXPECT_NEAR(train_losses(resumed, 1, dir, "")[0], want["loss"].get<double>(), 1e-5 * want["loss"].get<double>());
  fs::remove_all(root);
}

// The whole (fp32) parameters `names` after init_from_model(`dir`) under `c`.
std::map<std::string, Tensor> grown_params(const TrainConfig& c, const std::string& dir,
                                           const std::vector<std::string>& names) {
  std::map<std::string, Tensor> out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    init_from_model(t, *world, dir);
    for (const std::string& name : names) {
      Tensor whole = t.gather_param(name);
      if (w.rank() == 0) out[name] = whole;
    }
  });
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::equal(a.data<float>(), a.data<float>() + a.numel(), b.data<float>());
}

// Each rank builds its block (or, under sharding stages 1-2, its range of a bf16 parameter's
// master) of the same grown tensors; GPT-2's tied embedding grows once, around its rows' mean.
TEST(VocabResize, EveryLayoutHoldsTheSameGrownRowsAndGpt2sTiedEmbeddingGrowsToo) {
  const std::vector<std::string> names = {"model.embed_tokens.weight", "lm_head.weight"};
  const std::map<std::string, Tensor> ref = grown_params(grown("dp=1"), kModel, names);
  for (auto [mesh, stage, bf16] : {std::tuple{"dp=2", 1, true}, std::tuple{"dp=2,tp=2", 2, true},
                                   std::tuple{"dp=2", 3, false}, std::tuple{"tp=2,pp=2", 0, false}}) {
    TrainConfig c = grown(mesh);
    c.parallel.sharding.stage = stage, c.bf16 = bf16;
    const std::map<std::string, Tensor> got = grown_params(c, kModel, names);
    for (const std::string& name : names) EXPECT_TRUE(same_bits(got.at(name), ref.at(name))) << mesh << " " << name;
  }
  TrainConfig gpt2 = golden_fine_tune(kDir + "/gpt2_tiny", kDir + "/tokens.bin", "tp=2");
  const int64_t V = gpt2.model.vocab, H = gpt2.model.hidden;
  gpt2.init_vocab = V, gpt2.model.vocab = V + 1;  // odd over tp=2
  const Tensor wte = grown_params(gpt2, kDir + "/gpt2_tiny", {"transformer.wte.weight"}).at("transformer.wte.weight");
  const Tensor base = ckpt::GroupReader(kDir + "/gpt2_tiny", "model").file_of("transformer.wte.weight").read("transformer.wte.weight");
  ASSERT_EQ(wte.shape(), (Shape{V + 1, H}));
  EXPECT_TRUE(std::equal(base.data<float>(), base.data<float>() + base.numel(), wte.data<float>()));
  const auto [mu, sigma] = moments(base);
  for (int64_t j = 0; j < H; ++j) {
    const double sd = std::sqrt(1e-9 * sigma[static_cast<size_t>(j * H + j)]);
    EXPECT_NEAR(wte.data<float>()[V * H + j], mu[static_cast<size_t>(j)], 6 * sd + 1e-7) << j;
  }
}

TEST(VocabResize, AVocabularyTheRunDidNotAskToGrowOrGrownUnderLoraIsRefusedByName) {
  auto refusal = [](const TrainConfig& c) -> std::string {
    std::string message;
    comm::LocalWorld::run(1, [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      Trainer t(c, world);
      try {
        init_from_model(t, *world, kModel);
      } catch (const Error& e) {
        message = e.what();
      }
    });
    return message;
  };
  TrainConfig unasked = grown("dp=1");
  unasked.init_vocab = 0;
  EXPECT_NE(refusal(unasked).find("vocab_size 99 (directory) vs 101 (this run)"), std::string::npos) << refusal(unasked);
  TrainConfig lora = grown("dp=1");
  lora.model.lora.rank = 2;
  EXPECT_NE(refusal(lora).find("grows from 99 to 101 tokens, and LoRA keeps the embedding frozen"), std::string::npos)
      << refusal(lora);
}

}  // namespace
}  // namespace shardwise::train
