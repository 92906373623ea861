// Checkpoints of MoE Llamas in Mixtral's layout (model_io.h: mixtral_key_map, mixtral_config_json).
// The stacked experts [E, I, H] split over ep are stored as E per-expert keys; each stored slice is
// checked against the trainer's gathered parameter (Tensor::slice here, not the save code), a chain
// of loads and saves over ep=4 -> ep=2 -> 1 rank -> dp=2 x tp=2 keeps every stored tensor (weights,
// moments, fp32 masters) bit for bit, and a resume on another ep size (from or into sharding stage
// 3, or of a pp=2 x ep=2 save) continues the uninterrupted curve. tests/golden/hf/mixtral_tiny
// (tools/hf_mixtral.py: a transformers MixtralForCausalLM saved by save_pretrained) gives
// transformers' loss with --init-from on every mesh, and shardwise's
// checkpoints hold exactly its keys, shapes and config fields.
// The other direction needs PyPI and is run by hand (`make hf-parity`): tools/hf_mixtral.py, run
// 2026-11-24 with transformers 5.24.0 and torch 2.15.0, loaded a checkpoint shardwise saved on
// dp=2 x ep=2 with AutoModelForCausalLM (MixtralForCausalLM, no missing, unexpected or mismatched
// keys, no warnings), its loss on a batch, 4.0905933, equalled shardwise's on ep=2 and on one rank
// within 1e-5, and greedy `shardwise generate` on dp=2 x tp=2 gave its tokens for 3 prompts with
// logits within 1.8e-7 of transformers'.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/config_checks.h"
#include "tests/support/llama_config.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/models/model_io.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;
const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

int ranks_of(const std::string& mesh) { return static_cast<int>(mesh::parse_mesh(mesh).size()); }

TrainConfig moe(const std::string& mesh, bool bf16 = false) {
  TrainConfig c = llama_test_config(mesh, 6);
  c.model.experts = 4, c.model.top_k = 2, c.model.aux_loss = 0.01, c.model.router_z_loss = 0.001;
  c.bf16 = bf16;
  return c;
}

// `steps` steps of `c` after loading `from` (when given), saved into `to`; rank 0's gathered
// parameters (the fp32 masters) by name.
std::map<std::string, Tensor> run(const TrainConfig& c, int64_t steps, const fs::path& from, const fs::path& to) {
  std::map<std::string, Tensor> params;
  comm::LocalWorld::run(ranks_of(c.parallel.mesh), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    if (!from.empty()) load_trainer(t, *world, from);
    for (int64_t s = 0; s < steps; ++s) t.step();
    save_trainer(t, *world, to);
    for (ParamState& p : t.params()) {
      Tensor g = t.gather_param(p.name);
      if (w.rank() == 0) params[p.name] = g;
    }
  });
  return params;
}

// Every stored tensor of every group of a checkpoint, by group and key.
std::map<std::string, Tensor> stored(const fs::path& dir) {
  std::map<std::string, Tensor> out;
  for (const char* g : {"model", "optimizer", "master_weights"}) {
    ckpt::GroupReader r(dir, g);
    for (const std::string& k : r.names()) out[std::string(g) + ":" + k] = r.file_of(k).read(k);
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

TEST(MixtralCkpt, ExpertsAreStoredPerExpertAndComeBackBitForBitAcrossEpSizes) {
  const fs::path root = fs::temp_directory_path() / "sw_mixtral_bits";
  fs::remove_all(root);
  const std::map<std::string, Tensor> params = run(moe("ep=4", true), 2, {}, root / "ep4");
  const fs::path first = root / "ep4" / "checkpoint-2";
  const std::map<std::string, Tensor> files = stored(first);
  // The masters of expert e are slice e of the stacked parameter; no stacked key is stored.
  const std::string p = "model.layers.1.block_sparse_moe.";
  const Tensor& w2 = params.at(p + "experts.w2");  // [E, H, I]
  for (int64_t e = 0; e < 4; ++e) {
    const int64_t at[] = {e, 0, 0};
    const Tensor want = w2.slice(at, Shape{1, 32, 64});
    const Tensor& got = files.at(fmt::format("master_weights:{}experts.{}.w2.weight", p, e));
    ASSERT_EQ(got.shape(), (Shape{32, 64}));
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), 32 * 64 * 4), 0) << "expert " << e;
    EXPECT_TRUE(files.contains(fmt::format("optimizer:{}experts.{}.w1.weight/exp_avg_sq", p, e)));
    EXPECT_EQ(files.at(fmt::format("model:{}experts.{}.w3.weight", p, e)).dtype(), DType::BF16);
  }
  EXPECT_TRUE(files.contains("model:" + p + "gate.weight"));
  EXPECT_FALSE(files.contains("model:" + p + "experts.w1"));
  // weights, 2 moments, masters x (2 layers x (4 attention, 2 norms, gate, 12 experts) + embed, norm, head)
  EXPECT_EQ(files.size(), 4u * (2 * 19 + 3));
  // ep=4 -> ep=2 -> dp=2 x ep=2 -> 1 rank -> dp=2 x tp=2 (no ep): every load and save keeps every
  // stored tensor.
  fs::path from = first;
  for (const std::string mesh : {"ep=2", "dp=2,ep=2", "dp=1", "dp=2,tp=2"}) {
    const fs::path to = root / mesh;
    const std::map<std::string, Tensor> loaded = run(moe(mesh, true), 0, from, to);
    for (const auto& [name, t] : params) EXPECT_TRUE(same_bits(loaded.at(name), t)) << mesh << " " << name;
    const std::map<std::string, Tensor> again = stored(to / "checkpoint-2");
    ASSERT_EQ(again.size(), files.size()) << mesh;
    for (const auto& [key, t] : files) EXPECT_TRUE(same_bits(again.at(key), t)) << mesh << " " << key;
    from = to / "checkpoint-2";
  }
  // Trained on dp=2 x ep=2 (ep a data dim: each rank its own sequences) and saved, loaded on one
  // rank and saved again: the same parameters and stored tensors, bit for bit.
  const std::map<std::string, Tensor> trained = run(moe("dp=2,ep=2", true), 2, {}, root / "dpep");
  const std::map<std::string, Tensor> saved = stored(root / "dpep" / "checkpoint-2");
  EXPECT_EQ(saved.size(), files.size());
  const std::map<std::string, Tensor> one = run(moe("dp=1", true), 0, root / "dpep" / "checkpoint-2", root / "one");
  for (const auto& [name, t] : trained) EXPECT_TRUE(same_bits(one.at(name), t)) << "dp=2,ep=2 -> 1 rank " << name;
  const std::map<std::string, Tensor> again = stored(root / "one" / "checkpoint-2");
  for (const auto& [key, t] : saved) EXPECT_TRUE(same_bits(again.at(key), t)) << "dp=2,ep=2 -> 1 rank " << key;
  fs::remove_all(root);
}

// Sharding stage 2 on dp=2 x ep=2 keeps each rank's range of the dense state (over dp x ep) and of
// its experts' (over dp) and saves straight from them: loaded on one rank (unsharded) and saved
// again, every stored tensor (weights, moments, fp32 masters) is the same bits, and loaded back on
// dp=2 x ep=2 at stage 2 (v2, then v1) and saved, too.
TEST(MixtralCkpt, ShardedStateOnDpTimesEpSavesWhatOneRankLoadsAndBack) {
  const fs::path root = fs::temp_directory_path() / "sw_mixtral_sharded";
  fs::remove_all(root);
  TrainConfig sharded = moe("dp=2,ep=2", true);
  sharded.parallel.sharding = {2, "v2"};
  const std::map<std::string, Tensor> trained = run(sharded, 2, {}, root / "dpep");
  const std::map<std::string, Tensor> saved = stored(root / "dpep" / "checkpoint-2");
  EXPECT_EQ(saved.size(), 4u * (2 * 19 + 3));
  fs::path from = root / "dpep" / "checkpoint-2";
  for (const auto& [mesh, stage, layout] : {std::tuple{"dp=1", 0, "v1"}, {"dp=2,ep=2", 2, "v2"}, {"dp=2,ep=2", 2, "v1"}}) {
    TrainConfig c = moe(mesh, true);
    c.parallel.sharding = {stage, layout};
    const fs::path to = root / fmt::format("{}-{}{}", mesh, stage, layout);
    const std::map<std::string, Tensor> loaded = run(c, 0, from, to);
    for (const auto& [name, t] : trained) EXPECT_TRUE(same_bits(loaded.at(name), t)) << mesh << " " << name;
    const std::map<std::string, Tensor> again = stored(to / "checkpoint-2");
    ASSERT_EQ(again.size(), saved.size()) << mesh;
    for (const auto& [key, t] : saved) EXPECT_TRUE(same_bits(again.at(key), t)) << mesh << " " << layout << " " << key;
    from = to / "checkpoint-2";
  }
  fs::remove_all(root);
}

TEST(MixtralCkpt, ResumeOnAnotherEpSizeOrFromPipelineStagesContinuesTheSingleRankCurve) {
  const fs::path root = fs::temp_directory_path() / "sw_mixtral_resume";
  fs::remove_all(root);
  const std::vector<double> whole = train_losses(moe("dp=1"), 6, {}, {});
  train_losses(moe("ep=2"), 3, {}, root);
  TrainConfig zero3 = moe("dp=2,ep=2");  // parameters, gradients and moments sharded over dp as well
  zero3.parallel.sharding.stage = 3;
  for (const TrainConfig& c : {moe("ep=4"), moe("dp=2,ep=2"), zero3}) {
    const std::vector<double> rest = train_losses(c, 3, root / "checkpoint-3", {});
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(rest[i], whole[i + 3], 1e-5 * whole[i + 3]) << c.parallel.mesh << " stage " << c.parallel.sharding.stage << " step " << i + 4;
  }
  fs::remove_all(root);
  train_losses(zero3, 3, {}, root);  // saved from stage 3's shards
  const std::vector<double> back = train_losses(moe("ep=4"), 3, root / "checkpoint-3", {});
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(back[i], whole[i + 3], 1e-5 * whole[i + 3]) << "from stage 3, step " << i + 4;
  // Saved from stage 2 v2's ranges (a dp rank's flat range of each expert block cuts across the
  // expert slices: written and read straight into and out of the per-expert keys), resumed on ep=4
  // and into stage 1 v2 on dp=2 x ep=2 (ranges read back out of the slices).
  fs::remove_all(root);
  TrainConfig v2 = moe("dp=2,ep=2");
  v2.parallel.sharding.stage = 2;
  v2.parallel.sharding.layout = "v2";
  train_losses(v2, 3, {}, root);
  TrainConfig v2s1 = v2;
  v2s1.parallel.sharding.stage = 1;
  for (const TrainConfig& c : {moe("ep=4"), v2s1}) {
    const std::vector<double> rest = train_losses(c, 3, root / "checkpoint-3", {});
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(rest[i], whole[i + 3], 1e-5 * whole[i + 3]) << "from stage 2 v2 into " << c.parallel.mesh << " stage "
                                                               << c.parallel.sharding.stage << ", step " << i + 4;
  }
  // Saved by pipeline stages (pp=2 x ep=2: each stage's experts by its ep ranks; the router losses
  // are off, pp does not carry them), resumed on one rank.
  auto no_router_losses = [](const std::string& mesh) {
    TrainConfig c = moe(mesh);
    c.model.aux_loss = 0, c.model.router_z_loss = 0;
    return c;
  };
  const std::vector<double> plain = train_losses(no_router_losses("dp=1"), 6, {}, {});
  fs::remove_all(root);
  train_losses(no_router_losses("pp=2,ep=2"), 3, {}, root);
  const std::vector<double> rest = train_losses(no_router_losses("dp=1"), 3, root / "checkpoint-3", {});
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(rest[i], plain[i + 3], 1e-5 * plain[i + 3]) << "pp=2,ep=2 step " << i + 4;
  fs::remove_all(root);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

TrainConfig fine_tune(const std::string& mesh) {
  return golden_fine_tune(kGolden + "/mixtral_tiny", kGolden + "/mixtral_tokens.bin", mesh);
}

TEST(MixtralCkpt, InitFromTransformersMixtralGivesItsLossOnEveryMesh) {
  const GptConfig m = read_model_config(kGolden + "/mixtral_tiny");
  EXPECT_EQ(m.experts, 4);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.key_value_heads(), 2);
  const double want = read_json(kGolden + "/mixtral_tiny_expected.json")["loss"].get<double>();
  for (const std::string mesh : {"dp=1", "ep=2", "ep=2,tp=2"}) {
    EXPECT_NEAR(init_from_first_loss(fine_tune(mesh), kGolden + "/mixtral_tiny"), want, 1e-5 * want) << mesh;
  }
}

// transformers' MixtralForCausalLM adds router_aux_loss_coef x load_balancing_loss_func of every
// layer's router logits pooled; --aux-loss-scope model gives that loss and its gradient, layer one
// term per layer (the golden: transformers' function on each layer alone, and autograd's norms).
TEST(MixtralCkpt, AuxLossScopesGiveTransformersLoadBalancingLossesAndGradients) {
  const nlohmann::json golden = read_json(kGolden + "/mixtral_tiny_expected.json");
  const double ce = golden["loss"].get<double>(), coef = golden["aux_coef"].get<double>();
  const double pooled = ce + coef * golden["aux_loss_model"].get<double>();
  double per_layer = ce;
  for (const auto& a : golden["aux_loss_layers"]) per_layer += coef * a.get<double>();
  ASSERT_GT(std::abs(pooled - per_layer), 1e-3);  // two layers: the scopes differ
  for (const std::string mesh : {"dp=1", "dp=2,ep=2"}) {
    for (const std::string scope : {"model", "layer"}) {
      TrainConfig c = fine_tune(mesh);
      // ep is a data dim: the 4 sequences (all the same one) split over dp x ep in one micro-batch
      if (mesh != "dp=1") c.optimizer.accumulation = 1;
      c.model.aux_loss = coef;
      c.model.aux_loss_scope = scope;
      StepResult first;
      comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh).size()), [&](comm::Communicator& w) {
        auto world = w.group(w.members());
        Trainer t(c, world);
        init_from_model(t, *world, kGolden + "/mixtral_tiny");
        const StepResult r = t.step();
        if (w.rank() == 0) first = r;
      });
      const double loss = scope == "model" ? pooled : per_layer;
      const double norm = golden[scope == "model" ? "grad_norm_model" : "grad_norm_layer"].get<double>();
      EXPECT_NEAR(first.loss, loss, 1e-5 * loss) << mesh << " " << scope;
      EXPECT_NEAR(first.grad_norm, norm, 1e-5 * norm) << mesh << " " << scope;
    }
  }
}

TEST(MixtralCkpt, CheckpointsHoldTransformersKeysShapesAndConfig) {
  const fs::path root = fs::temp_directory_path() / "sw_mixtral_hf";
  fs::remove_all(root);
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(fine_tune("ep=2"), world);
    init_from_model(t, *world, kGolden + "/mixtral_tiny");
    save_trainer(t, *world, root);
  });
  const fs::path dir = root / "checkpoint-0";
  const nlohmann::json ours_config = read_json(dir / "config.json"), theirs_config = read_json(kGolden + "/mixtral_tiny/config.json");
  for (const char* k : {"architectures", "model_type", "num_local_experts", "num_experts_per_tok", "hidden_size",
                        "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                        "vocab_size", "tie_word_embeddings", "hidden_act", "router_jitter_noise", "sliding_window",
                        "output_router_logits"})
    EXPECT_EQ(ours_config[k], theirs_config[k]) << k;
  std::map<std::string, Shape> theirs, ours;
  ckpt::SafetensorsFile file(kGolden + "/mixtral_tiny/model.safetensors");
  for (const auto& t : file.tensors()) theirs[t.name] = t.shape;
  ckpt::GroupReader reader(dir, "model");
  for (const std::string& k : reader.names()) ours[k] = reader.info(k).shape;
  EXPECT_EQ(ours, theirs);
  EXPECT_TRUE(ours.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  fs::remove_all(root);
}

TEST(MixtralCkpt, MixtralConfigsShardwiseCannotBuildExactlyAreRefused) {
  const fs::path dir = fs::temp_directory_path() / "sw_mixtral_configs";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const nlohmann::json base = read_json(kGolden + "/mixtral_tiny/config.json");
  auto refused = [&](const char* key, const nlohmann::json& value) { return config_refused(dir, base, key, value); };
  EXPECT_TRUE(refused("router_jitter_noise", 0.01));
  EXPECT_TRUE(refused("sliding_window", 8));  // shorter than max_position_embeddings 16
  EXPECT_TRUE(refused("num_local_experts", nullptr));
  EXPECT_FALSE(refused("sliding_window", 4096));
  fs::remove_all(dir);
}

// A model with dense layers among the MoE ones (--moe-layers) has no Mixtral config.json: it is
// written as model_type shardwise_mixtral with Qwen2-MoE's mlp_only_layers (the dense layers), read
// back as the same MoE layers; its checkpoint resumed on other ep sizes continues the single-rank
// curve, and --init-from it loads the saved parameters bit for bit on another mesh (and refuses a
// run with other MoE layers, naming both lists).
TEST(MixtralCkpt, DenseLayersAmongMoeOnesSaveResumeAndInitFromAsShardwiseMixtral) {
  auto partial = [](const std::string& mesh) {
    TrainConfig c = moe(mesh);
    c.model.moe_layers = {1};
    return c;
  };
  const nlohmann::json config = model_config_json(partial("dp=1").model, DType::F32, default_special_tokens(64));
  EXPECT_EQ(config["model_type"], "shardwise_mixtral");
  EXPECT_EQ(config["mlp_only_layers"], nlohmann::json::array({0}));
  EXPECT_EQ(read_llama_config(config, "config.json").moe_layers, std::vector<int64_t>{1});
  const fs::path root = fs::temp_directory_path() / "sw_mixtral_partial";
  fs::remove_all(root);
  fs::create_directories(root / "refused");
  EXPECT_TRUE(config_refused(root / "refused", config, "mlp_only_layers", nlohmann::json::array({0, 1})));
  EXPECT_TRUE(config_refused(root / "refused", config, "mlp_only_layers", nlohmann::json::array({2})));
  const std::vector<double> whole = train_losses(partial("dp=1"), 6, {}, {});
  std::map<std::string, Tensor> saved;
  train_losses(partial("ep=2"), 3, {}, root, &saved);
  const fs::path dir = root / "checkpoint-3";
  ckpt::GroupReader model(dir, "model");
  EXPECT_TRUE(model.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(model.contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_FALSE(model.contains("model.layers.0.block_sparse_moe.gate.weight"));
  for (const std::string mesh : {"ep=4", "dp=2,ep=2"}) {
    const std::vector<double> rest = train_losses(partial(mesh), 3, dir, {});
    ASSERT_EQ(rest.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(rest[i], whole[i + 3], 1e-5 * whole[i + 3]) << mesh << " step " << i + 4;
  }
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(partial("dp=2,ep=2"), world);
    init_from_model(t, *world, dir);
    for (ParamState& p : t.params()) {
      Tensor g = t.gather_param(p.name);
      if (w.rank() == 0) {
        EXPECT_TRUE(same_bits(g, saved.at(p.name))) << p.name;
      }
    }
  });
  TrainConfig every = moe("dp=1");
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(every, world);
    try {
      init_from_model(t, *world, dir);
      ADD_FAILURE() << "--init-from a model with other MoE layers";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MoE layers [1] (directory) vs [0,1] (this run, --moe-layers)"),
                std::string::npos) << e.what();
    }
  });
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardwise::train
