// PEFT on shardwise's Llama-builder adapters, replayed without PyPI. tests/golden/hf/lora_llama
// (all-linear, rsLoRA, on llama_tiny), lora_qwen2 (PEFT's default targets q_proj and v_proj, on
// qwen2_tiny: its q/k/v biases frozen), lora_qwen3 (all-linear on qwen3_tiny: the k_proj adapter
// before the per-head k norm) and lora_mistral (the default targets on mistral_tiny) are adapters
// shardwise trained on dp=2 x tp=2 and saved;
// tools/hf_lora_llama.py loaded each into transformers with PeftModel.from_pretrained (no warning:
// PEFT's keys and config) and recorded PEFT's loss on the base's token file, and the last logits
// and greedy tokens of PEFT's merge_and_unload. Here: the adapter gives PEFT's loss on every mesh,
// and `ckpt lora-merge` gives a model with merge_and_unload's logits and greedy tokens. lora_mixtral
// adapts the experts as PEFT's target_parameters: PEFT's loss on every mesh; lora-merge refuses it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/tools.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "tests/support/hf_generation.h"
#include "tests/support/llama_config.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

nlohmann::json expected(const std::string& name) {
  std::ifstream f(kHfGoldenDir + "/lora_" + name + "_expected.json");
  return nlohmann::json::parse(f);
}

// The first step's loss (before any update) from the base and the golden adapter on `mesh`.
double adapted_loss(const std::string& name, const std::string& mesh) {
  const std::string base = kHfGoldenDir + "/" + name + "_tiny", adapter = kHfGoldenDir + "/lora_" + name;
  TrainConfig c = golden_fine_tune(base, kHfGoldenDir + "/" + name + "_tokens.bin", mesh);
  c.model.lora = read_adapter_config(adapter);
  double loss = 0;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    init_from_model(t, *world, base);
    load_adapter(t, *world, adapter);
    const double l = t.step().loss;
    if (w.rank() == 0) loss = l;
  });
  return loss;
}

TEST(LoraHfGolden, ShardwisesLlamaQwenAndMistralAdaptersGivePeftsLossOnEveryMesh) {
  for (const std::string name : {"llama", "qwen2", "qwen3", "mistral"}) {
    const double want = expected(name)["loss"].get<double>();
    for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2"})
      EXPECT_NEAR(adapted_loss(name, mesh), want, 1e-5 * want) << name << " on " << mesh;
  }
}

// tests/golden/hf/lora_mixtral: q_proj, v_proj and the experts' fused parameters (PEFT's
// target_parameters experts.gate_up_proj, experts.down_proj), trained on dp=2 x ep=2.
TEST(LoraHfGolden, ShardwisesMixtralExpertAdaptersGivePeftsLossOnEveryMeshAndLoraMergeRefusesThem) {
  const double want = expected("mixtral")["loss"].get<double>();
  for (const std::string mesh : {"dp=1", "ep=2", "ep=2,tp=2", "dp=2,tp=2", "pp=2"})
    EXPECT_NEAR(adapted_loss("mixtral", mesh), want, 1e-5 * want) << "mixtral on " << mesh;
  std::ifstream f(kHfGoldenDir + "/lora_mixtral/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(f);
  EXPECT_EQ(config["target_parameters"], nlohmann::json({"experts.gate_up_proj", "experts.down_proj"}));
  EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
  EXPECT_EQ(config["lora_dropout"], 0.0);
  const fs::path out = fs::temp_directory_path() / "sw_lora_hf_merged_mixtral";
  try {
    ckpt::lora_merge(kHfGoldenDir + "/mixtral_tiny", kHfGoldenDir + "/lora_mixtral", out, {});
    ADD_FAILURE() << "lora-merge merged an expert adapter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adapts the experts' fused parameters (target_parameters"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST(LoraHfGolden, LoraMergeGivesMergeAndUnloadsLogitsAndGreedyTokens) {
  for (auto [name, modules] :
       {std::pair{"llama", 14u}, std::pair{"qwen2", 4u}, std::pair{"qwen3", 14u}, std::pair{"mistral", 4u}}) {
    const fs::path out = fs::temp_directory_path() / (std::string("sw_lora_hf_merged_") + name);
    fs::remove_all(out);
    EXPECT_EQ(ckpt::lora_merge(kHfGoldenDir + "/" + name + "_tiny", kHfGoldenDir + "/lora_" + name, out, {}), modules)
        << name;
    const nlohmann::json want = expected(name)["merged"];
    expect_logits_and_greedy(out.string(), want, {"dp=1", "tp=2"}, want["eos"].get<int64_t>());
    fs::remove_all(out);
  }
}

// The files are PEFT's for a LlamaForCausalLM: nn.Linear (fan_in_fan_out false), CAUSAL_LM, keys
// base_model.model.<module>.lora_A/B.weight; all-linear saved as the adapted modules' paths.
TEST(LoraHfGolden, TheAdapterFilesHavePeftsNamesAndConfig) {
  std::ifstream f(kHfGoldenDir + "/lora_llama/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(f);
  EXPECT_EQ(config["fan_in_fan_out"], false);
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["target_modules"].size(), 14u);
  ckpt::SafetensorsFile file(kHfGoldenDir + "/lora_llama/adapter_model.safetensors");
  EXPECT_EQ(file.tensors().size(), 28u);
  EXPECT_EQ(file.info("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight").shape,
            (Shape{8, 4}));
  EXPECT_EQ(file.info("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight").shape,
            (Shape{4, 32}));
  std::ifstream q(kHfGoldenDir + "/lora_qwen2/adapter_config.json");
  EXPECT_EQ(nlohmann::json::parse(q)["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
}

}  // namespace
}  // namespace shardwise::train
