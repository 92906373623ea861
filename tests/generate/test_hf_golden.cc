// transformers' GPT-2 files replayed without PyPI: tests/golden/hf/ was written by
// tools/hf_parity.py (`make hf-golden`): a random-init GPT2LMHeadModel saved by save_pretrained, a
// token file of 17 tokens, and transformers' loss on it. `--init-from` that directory on several
// meshes gives transformers' loss within 1e-5; skipped keys keep shardwise's initialization;
// `shardwise generate`'s graphs give transformers' logits within 1e-5 and its greedy tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/generate/generate.h"
#include "shardwise/models/model_io.h"
#include "tests/support/hf_generation.h"

namespace shardwise::train {
namespace {

const std::string kDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

nlohmann::json expected() {
  std::ifstream f(kDir + "/gpt2_tiny_expected.json");
  return nlohmann::json::parse(f);
}

TrainConfig fine_tune(const std::string& mesh) {
  TrainConfig c;
  c.model = read_model_config(kDir + "/gpt2_tiny");
  c.parallel.mesh = mesh;
  c.optimizer.steps = 1;
  c.optimizer.global_batch = 4;
  c.data.files = kDir + "/tokens.bin";
  c.data.format = "u16";
  return c;
}

// The first step's loss (before any update) after --init-from, and the gathered parameters.
double first_loss(const std::string& mesh, const std::vector<std::string>& ignore,
                  std::map<std::string, Tensor>* params = nullptr, bool init = true) {
  double loss = 0;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig c = fine_tune(mesh);
    c.check(w.size());
    Trainer t(c, world);
    if (init) init_from_model(t, *world, kDir + "/gpt2_tiny", ignore);
    if (params) {
      for (ParamState& p : t.params()) {
        Tensor g = t.gather_param(p.name);
        if (w.rank() == 0) (*params)[p.name] = g;
      }
    }
    const double l = t.step().loss;
    if (w.rank() == 0) loss = l;
  });
  return loss;
}

TEST(HfGolden, InitFromTransformersGivesItsLossOnEveryMesh) {
  const double want = expected()["loss"].get<double>();
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "tp=4", "pp=2", "tp=2,pp=2"}) {
    EXPECT_NEAR(first_loss(mesh, {}), want, 1e-5 * want) << mesh;
  }
}

TEST(HfGolden, WeightsAreTheFilesAndSkippedKeysKeepTheirInitialization) {
  std::map<std::string, Tensor> loaded, fresh;
  first_loss("tp=2", {"transformer.wpe.weight", "*.h.1.attn.c_attn.*"}, &loaded);
  first_loss("tp=2", {}, &fresh, /*init=*/false);
  ckpt::SafetensorsFile file(kDir + "/gpt2_tiny/model.safetensors");
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  EXPECT_TRUE(same(loaded.at("transformer.wte.weight"), file.read("transformer.wte.weight")));
  EXPECT_TRUE(same(loaded.at("transformer.h.0.mlp.c_fc.weight"), file.read("transformer.h.0.mlp.c_fc.weight")));
  // q of layer 0 is columns [0, 32) of c_attn.
  Tensor c_attn = file.read("transformer.h.0.attn.c_attn.weight");
  EXPECT_TRUE(same(loaded.at("transformer.h.0.attn.q_proj.weight"),
                   c_attn.slice(std::vector<int64_t>{0, 0}, Shape{32, 32})));
  EXPECT_TRUE(same(loaded.at("transformer.h.0.attn.v_proj.weight"),
                   c_attn.slice(std::vector<int64_t>{0, 64}, Shape{32, 32})));
  for (const char* skipped : {"transformer.wpe.weight", "transformer.h.1.attn.k_proj.weight",
                              "transformer.h.1.attn.q_proj.bias"}) {
    EXPECT_TRUE(same(loaded.at(skipped), fresh.at(skipped))) << skipped;
  }
}

TEST(HfGolden, AnotherModelIsRefusedNamingTheField) {
  // A model of another width: the error names the field.
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig c = fine_tune("dp=1");
    c.model.hidden = 64;
    c.check(1);
    Trainer t(c, world);
    try {
      init_from_model(t, *world, kDir + "/gpt2_tiny");
      ADD_FAILURE() << "another model loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("n_embd 32 (directory) vs 64"), std::string::npos) << e.what();
    }
  });
}

// transformers' greedy generate stops at its config's eos, 299.
TEST(HfGolden, GenerationGivesTransformersLogitsAndGreedyTokens) {
  expect_transformers_logits_and_greedy("gpt2_tiny", {"dp=1", "tp=2", "dp=2,tp=2"}, 299);
}

TEST(HfGolden, AMissingKeyIsNamedAndIgnoreKeysSkipsIt) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "sw_hf_golden_missing";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kDir + "/gpt2_tiny/config.json", dir / "config.json");
  int64_t written = 0;  // the tensors the directory stores (its file keys)
  {
    ckpt::SafetensorsFile file(kDir + "/gpt2_tiny/model.safetensors");
    std::vector<Tensor> kept;
    std::vector<ckpt::StEntry> entries;
    for (const auto& t : file.tensors()) {
      if (t.name == "transformer.wpe.weight") continue;
      kept.push_back(file.read(t.name));
      entries.push_back(ckpt::entry_of(t.name, kept.back()));
    }
    ckpt::write_safetensors(dir / "model.safetensors", entries, ckpt::StMetadata{{"format", "pt"}});
    written = static_cast<int64_t>(entries.size());
  }
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig c = fine_tune("tp=2");
    c.check(2);
    Trainer t(c, world);
    try {
      init_from_model(t, *world, dir);
      ADD_FAILURE() << "a missing key loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("missing from the checkpoint (1): 'transformer.wpe.weight'"),
                std::string::npos) << e.what();
    }
    // It reads every stored tensor but the skipped one (counted as the files name them: c_attn once).
    EXPECT_EQ(init_from_model(t, *world, dir, {"transformer.wpe.*"}), written);
  });
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardwise::train
