// PEFT's LoRA files replayed without PyPI: tests/golden/hf/lora_gpt2 is an adapter PEFT saved on
// the gpt2_tiny base (r 4, alpha 8, rsLoRA, c_attn / c_proj / c_fc, B drawn non-zero), written by
// tools/hf_parity.py with PEFT's loss on tokens.bin and samples of merge_and_unload's weights. Here:
// shardwise loads that adapter and gives PEFT's loss on every mesh; lora_merge gives PEFT's merged
// weights; an adapter shardwise saves has PEFT's keys, shapes and adapter_config.json, loads back,
// and a LoRA run resumed on another mesh continues the same curve.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/tools.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/models/model_io.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";
const std::string kBase = kDir + "/gpt2_tiny", kAdapter = kDir + "/lora_gpt2";

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

TrainConfig peft_run(const std::string& mesh, int64_t steps) {
  TrainConfig c;
  c.model = read_model_config(kBase);
  c.model.lora = read_adapter_config(kAdapter);
  c.parallel.mesh = mesh;
  c.optimizer.steps = steps;
  c.optimizer.global_batch = 4;
  c.optimizer.lr = 1e-2, c.optimizer.warmup = 1;
  c.data.files = kDir + "/tokens.bin";
  c.data.format = "u16";
  return c;
}

// Losses of `steps` steps after --init-from the base (and --lora-from `adapter` when given), after
// load_trainer(`resume`) when given; saves into `save` at the end when given.
std::vector<double> losses(const TrainConfig& c, const std::string& adapter, const fs::path& resume = {},
                           const fs::path& save = {}) {
  std::vector<double> out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    init_from_model(t, *world, kBase);
    if (!adapter.empty()) load_adapter(t, *world, adapter);
    if (!resume.empty()) load_trainer(t, *world, resume);
    while (t.steps_done() < c.optimizer.steps) {
      const double l = t.step().loss;
      if (w.rank() == 0) out.push_back(l);
    }
    if (!save.empty()) save_trainer(t, *world, save);
  });
  return out;
}

TEST(LoraGolden, APeftAdapterGivesPeftsLossOnEveryMesh) {
  const double want = read_json(kDir + "/lora_gpt2_expected.json")["loss"].get<double>();
  EXPECT_TRUE(peft_run("dp=1", 1).model.lora.rslora);
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "pp=2"}) {
    EXPECT_NEAR(losses(peft_run(mesh, 1), kAdapter)[0], want, 1e-5 * want) << mesh;
  }
  // Without the adapter the same run starts from the base model's loss.
  const double base = read_json(kDir + "/gpt2_tiny_expected.json")["loss"].get<double>();
  EXPECT_NEAR(losses(peft_run("tp=2", 1), "")[0], base, 1e-5 * base);
}

TEST(LoraGolden, LoraMergeEqualsPeftsMergeAndUnload) {
  const fs::path out = fs::temp_directory_path() / "sw_lora_golden_merge";
  fs::remove_all(out);
  EXPECT_EQ(ckpt::lora_merge(kBase, kAdapter, out, {}), 8u);  // 2 layers x c_attn, c_proj, c_fc, mlp.c_proj
  const nlohmann::json merged = read_json(kDir + "/lora_gpt2_expected.json")["merged"];
  ASSERT_EQ(merged.size(), 8u);
  ckpt::GroupReader reader(out, "model");
  for (const auto& [name, want] : merged.items()) {
    Tensor got = reader.file_of(name).read(name).to(DType::F64);
    ASSERT_EQ(got.shape(), Shape(std::span<const int64_t>(want["shape"].get<std::vector<int64_t>>()))) << name;
    const int64_t stride = want["stride"].get<int64_t>();
    const auto samples = want["samples"].get<std::vector<double>>();
    for (size_t k = 0; k < samples.size(); ++k)
      EXPECT_NEAR(got.at(static_cast<int64_t>(k) * stride), samples[k], 1e-6) << name << " element " << k * stride;
    double sum = 0;
    for (int64_t i = 0; i < got.numel(); ++i) sum += got.at(i);
    EXPECT_NEAR(sum, want["sum"].get<double>(), 1e-6 * static_cast<double>(got.numel())) << name;
  }
  // The merged model is the adapted one: --init-from it gives PEFT's loss without adapters.
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig c = peft_run("tp=2", 1);
    c.model.lora = LoraConfig();
    Trainer t(c, world);
    init_from_model(t, *world, out);
    const double want = read_json(kDir + "/lora_gpt2_expected.json")["loss"].get<double>();
    EXPECT_NEAR(t.step().loss, want, 1e-5 * want);
  });
  fs::remove_all(out);
}

TEST(LoraGolden, SavedAdaptersArePeftsFilesAndLoadBackAndResume) {
  const fs::path root = fs::temp_directory_path() / "sw_lora_golden_save";
  fs::remove_all(root);
  // 4 steps straight on one rank; 2 steps on dp=2 x tp=2, saved, resumed on tp=2 for 2 more.
  const std::vector<double> straight = losses(peft_run("dp=1", 4), kAdapter);
  const std::vector<double> first = losses(peft_run("dp=2,tp=2", 2), kAdapter, {}, root);
  const fs::path ckpt = root / "checkpoint-2";
  const std::vector<double> rest = losses(peft_run("tp=2", 4), "", ckpt);
  ASSERT_EQ(first.size() + rest.size(), straight.size());
  for (size_t s = 0; s < straight.size(); ++s) {
    const double got = s < first.size() ? first[s] : rest[s - first.size()];
    EXPECT_NEAR(got, straight[s], 1e-5 * straight[s]) << "step " << s + 1;
  }
  // PEFT's files: what PEFT wrote for the same configuration, but base_model_name_or_path and
  // PEFT's own peft_version.
  EXPECT_FALSE(fs::exists(ckpt / "config.json") || fs::exists(ckpt / "model.safetensors.index.json"));
  nlohmann::json ours = read_json(ckpt / "adapter_config.json"), peft = read_json(kAdapter + "/adapter_config.json");
  EXPECT_EQ(ours["base_model_name_or_path"], kBase);
  for (nlohmann::json* j : {&ours, &peft}) j->erase("base_model_name_or_path"), j->erase("peft_version");
  auto sorted = [](nlohmann::json t) {
    std::sort(t.begin(), t.end());
    return t;
  };
  EXPECT_EQ(sorted(ours["target_modules"]), sorted(peft["target_modules"]));
  ours.erase("target_modules"), peft.erase("target_modules");
  EXPECT_EQ(ours, peft) << ours.dump(1) << "\nPEFT:\n" << peft.dump(1);
  ckpt::SafetensorsFile saved((ckpt / "adapter_model.safetensors").string()),
      golden(kAdapter + "/adapter_model.safetensors");
  ASSERT_EQ(saved.tensors().size(), golden.tensors().size());
  for (const auto& t : golden.tensors()) {
    ASSERT_NE(saved.header().find(t.name), nullptr) << t.name;
    EXPECT_EQ(saved.info(t.name).shape, t.shape) << t.name;
    EXPECT_EQ(saved.info(t.name).dtype, t.dtype) << t.name;
  }
  using Metadata = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(saved.header().metadata, (Metadata{{"format", "pt"}}));
  // --lora-from the checkpoint gives the adapters it saved (fp32, bit for bit).
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(peft_run("tp=2", 1), world);
    init_from_model(t, *world, kBase);
    load_adapter(t, *world, ckpt.string());
    Tensor b = t.gather_param("transformer.h.1.attn.k_proj.lora_B.weight");  // rows [32, 64) of c_attn's lora_B
    Tensor file = saved.read("base_model.model.transformer.h.1.attn.c_attn.lora_B.weight");
    EXPECT_EQ(std::memcmp(b.raw(), file.slice(std::vector<int64_t>{32, 0}, Shape{32, 4}).raw(), b.nbytes()), 0);
  });
  fs::remove_all(root);
}

TEST(LoraGolden, AdaptersOfAnotherShapeOrBaseAreRefusedNamingBoth) {
  const fs::path bad = fs::temp_directory_path() / "sw_lora_golden_bad";
  fs::remove_all(bad);
  fs::create_directories(bad);
  fs::copy_file(kAdapter + "/adapter_model.safetensors", bad / "adapter_model.safetensors");
  nlohmann::json config = read_json(kAdapter + "/adapter_config.json");
  config["r"] = 2;  // the file's matrices are rank 4
  std::ofstream(bad / "adapter_config.json") << config.dump(2);
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig c = peft_run("dp=1", 1);
    c.model.lora = read_adapter_config(bad);
    Trainer t(c, world);
    try {
      load_adapter(t, *world, bad);
      ADD_FAILURE() << "an adapter of another rank loaded";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--lora-from " + bad.string()), std::string::npos) << m;
      EXPECT_NE(m.find("'transformer.h.0.attn.c_attn.lora_A.weight' 2x32"), std::string::npos) << m;
      EXPECT_NE(m.find("has shape 4x32 in the checkpoint"), std::string::npos) << m;
    }
  });
  config["r"] = 4;
  config["use_dora"] = true;
  std::ofstream(bad / "adapter_config.json") << config.dump(2);
  try {
    read_adapter_config(bad);
    ADD_FAILURE() << "DoRA accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sets use_dora = true"), std::string::npos) << e.what();
  }
  fs::remove_all(bad);
}

}  // namespace
}  // namespace shardwise::train
