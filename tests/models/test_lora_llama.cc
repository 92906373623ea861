// LoRA on the Llama builder (models/llama.cc, models/lora.h): the small Llama of the Llama tests
// (4 heads over 2 kv heads, SwiGLU 64) from its seeded initialization, its base frozen. The
// adapters' gradients and losses on dp=2 x tp=2, tp=4 (k/v replicated over tp), tp=2 + sp and
// pp=2 equal the single-rank run's; the base stays bit-identical and holds no optimizer state; the
// adapters shard like their base weights; recompute keeps the frozen weights frozen; PEFT's
// default targets and all-linear; a Qwen2 (q/k/v biases) and a Qwen3 (q/k norms, and one whose
// head_dim is not hidden / heads); a MoE model
// adapts its attention and its experts' fused parameters (PEFT's target_parameters) and refuses
// its router and shared expert.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "shardwise/core/error.h"
#include "shardwise/models/lora.h"
#include "tests/support/llama_config.h"
#include "tests/support/lora_run.h"

namespace shardwise::train {
namespace {

constexpr int64_t kRank = 4;

TrainConfig llama_lora(const std::string& mesh, int64_t steps = 3, std::vector<std::string> targets = {"all-linear"}) {
  TrainConfig c = llama_test_config(mesh, steps);
  c.model.lora.rank = kRank;
  c.model.lora.alpha = 8;
  c.model.lora.targets = std::move(targets);
  c.optimizer.lr = 1e-2, c.optimizer.warmup = 1;
  return c;
}

std::string error_of(TrainConfig c) {
  try {
    c.check(1);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(LoraLlama, AdaptersOnEveryMeshEqualTheSingleRankRun) {
  const LoraRun ref = run_lora(llama_lora("dp=1"));
  ASSERT_EQ(ref.grads.size(), 3u);
  ASSERT_EQ(ref.grads[0].size(), 28u);  // 2 layers x 7 linear layers x A, B
  double a2 = 0, b1 = 0;
  for (int64_t i = 0; i < kRank * 32; ++i) {
    a2 = std::max(a2, std::abs(ref.grads[1].at("model.layers.0.self_attn.k_proj.lora_A.weight").at(i)));
    b1 = std::max(b1, std::abs(ref.grads[0].at("model.layers.1.mlp.down_proj.lora_B.weight").at(i)));
  }
  EXPECT_GT(a2, 0.0);
  EXPECT_GT(b1, 0.0);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  for (const std::string mesh : {"dp=2,tp=2", "tp=4"}) expect_same(run_lora(llama_lora(mesh)), ref, mesh);
  TrainConfig sp = llama_lora("tp=2");
  sp.parallel.sequence_parallel = true;
  expect_same(run_lora(sp), ref, "tp=2 + sp");
  const LoraRun pp = run_lora(llama_lora("pp=2"), false);
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(pp.losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << s;
}

TEST(LoraLlama, FrozenBaseStaysBitIdenticalHoldsNoStateAndAdaptersShardLikeTheirBase) {
  const LoraRun r = run_lora(llama_lora("dp=2,tp=2", 3), false, true);
  ASSERT_EQ(r.frozen_before.size(), 21u);  // embed, head, norm + 2 x (7 linear + 2 norms)
  for (const auto& [name, before] : r.frozen_before) {
    const Tensor& after = r.frozen_after.at(name);
    EXPECT_TRUE(before.shape() == after.shape() && std::memcmp(before.raw(), after.raw(), before.nbytes()) == 0)
        << name << " changed";
  }
  // Per layer, H 32, kv width 16, I 64: q, o: A [r, 32] B [32, r]; k, v: B [16, r]; gate, up: B [64, r]; down: A [r, 64].
  const int64_t adapters = 2 * kRank * ((32 + 32) * 2 + (32 + 16) * 2 + (32 + 64) * 2 + (64 + 32));
  EXPECT_EQ(r.counts.trained, adapters);
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    Trainer t(llama_lora("dp=2,tp=2", 1), w.group(w.members()));
    int64_t local = 0;
    for (const ParamState& p : t.params()) {
      EXPECT_TRUE(is_lora_param(p.name)) << p.name << " is trained";
      local += p.param.numel();
    }
    for (const ParamState& p : t.frozen())
      EXPECT_FALSE(p.exp_avg.defined() || p.exp_avg_sq.defined() || p.master.defined()) << p.name;
    EXPECT_EQ(t.optimizer_state_bytes(), 8 * local);
    std::map<std::string, std::string> dist;
    for (const ParamState& p : t.params()) dist[p.name] = p.dist.to_string();
    EXPECT_EQ(dist.at("model.layers.0.self_attn.q_proj.lora_A.weight"), "R,R");
    EXPECT_EQ(dist.at("model.layers.0.self_attn.k_proj.lora_B.weight"), "R,S(0)");
    EXPECT_EQ(dist.at("model.layers.0.mlp.up_proj.lora_B.weight"), "R,S(0)");
    EXPECT_EQ(dist.at("model.layers.1.self_attn.o_proj.lora_A.weight"), "R,S(1)");
    EXPECT_EQ(dist.at("model.layers.1.self_attn.o_proj.lora_B.weight"), "R,R");
    EXPECT_EQ(dist.at("model.layers.1.mlp.down_proj.lora_A.weight"), "R,S(1)");
    EXPECT_LT(local, adapters);
  });
  // tp=4 over 2 kv heads: k and v are replicated over tp, and so are their adapters.
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    Trainer t(llama_lora("tp=4", 1), w.group(w.members()));
    std::map<std::string, std::string> dist;
    for (const ParamState& p : t.params()) dist[p.name] = p.dist.to_string();
    EXPECT_EQ(dist.at("model.layers.0.self_attn.v_proj.lora_B.weight"), "R");
    EXPECT_EQ(dist.at("model.layers.0.self_attn.q_proj.lora_B.weight"), "S(0)");
  });
}

// Full recompute reruns each layer's forward before its backward: the recomputed copies read the
// same frozen weights, which stay bit-identical, and the curve and gradients are the plain run's.
TEST(LoraLlama, RecomputeKeepsTheBaseFrozenAndTheCurve) {
  const LoraRun plain = run_lora(llama_lora("dp=2,tp=2"));
  TrainConfig c = llama_lora("dp=2,tp=2");
  c.model.recompute = "full";
  const LoraRun full = run_lora(c, true, true);
  expect_same(full, plain, "recompute full");
  ASSERT_FALSE(full.frozen_before.empty());
  for (const auto& [name, before] : full.frozen_before)
    EXPECT_EQ(std::memcmp(before.raw(), full.frozen_after.at(name).raw(), before.nbytes()), 0) << name << " changed";
  c.model.recompute = "selective", c.model.attention = "unfused";
  TrainConfig unfused = llama_lora("dp=2,tp=2");
  unfused.model.attention = "unfused";
  expect_same(run_lora(c), run_lora(unfused), "recompute selective");
}

TEST(LoraLlama, PeftsDefaultTargetsQAndVAndTheFirstLossIsTheBases) {
  TrainConfig base = llama_test_config("dp=1", 1);
  base.optimizer.lr = 1e-2, base.optimizer.warmup = 1;
  const double want = run_lora(base, false).losses[0];
  const TrainConfig c = llama_lora("dp=1", 1, {});
  EXPECT_EQ(lora_target_modules(c.model), nlohmann::json({"q_proj", "v_proj"}));
  const LoraRun r = run_lora(c);
  EXPECT_EQ(r.losses[0], want);  // B = 0: the adapted model is the base
  std::vector<std::string> names;
  for (const auto& [name, g] : r.grads[0]) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.layers.0.self_attn.q_proj.lora_A.weight", "model.layers.0.self_attn.q_proj.lora_B.weight",
                       "model.layers.0.self_attn.v_proj.lora_A.weight", "model.layers.0.self_attn.v_proj.lora_B.weight",
                       "model.layers.1.self_attn.q_proj.lora_A.weight", "model.layers.1.self_attn.q_proj.lora_B.weight",
                       "model.layers.1.self_attn.v_proj.lora_A.weight", "model.layers.1.self_attn.v_proj.lora_B.weight"}));
  // all-linear is saved as PEFT saves it: every adapted module's path.
  EXPECT_EQ(lora_target_modules(llama_lora("dp=1").model).size(), 14u);
  EXPECT_EQ(adapter_config_json(c.model, "")["fan_in_fan_out"], false);
  // PEFT's string form: "all-linear" (any case) is the shorthand, any other string a regex.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sw_lora_llama_config";
  std::filesystem::create_directories(dir);
  for (const char* targets : {"All-Linear", R"(.*\.(q|v)_proj)"}) {
    nlohmann::json config = adapter_config_json(c.model, "");
    config["target_modules"] = targets;
    std::ofstream(dir / "adapter_config.json") << config.dump();
    TrainConfig read = c;
    read.model.lora = read_adapter_config(dir);
    EXPECT_EQ(read.model.lora.all_linear(), targets[0] == 'A') << targets;
    EXPECT_EQ(lora_modules(read.model).size(), targets[0] == 'A' ? 14u : 4u) << targets;
  }
  std::filesystem::remove_all(dir);
}

TEST(LoraLlama, Qwen2BiasesAndQwen3NormsFollowTheSingleRankRun) {
  for (const char* family : {"qwen2", "qwen3"}) {
    TrainConfig c = llama_lora("dp=1");
    c.model.family = family;
    const LoraRun ref = run_lora(c);
    c.parallel.mesh = "dp=2,tp=2";
    expect_same(run_lora(c), ref, family);
  }
  TrainConfig c = llama_lora("dp=1", 1, {"q_norm"});
  c.model.family = "qwen3";
  EXPECT_NE(error_of(c).find("--lora-targets 'q_norm' names 'model.layers.0.self_attn.q_norm', which LoRA does not "
                             "adapt here"), std::string::npos) << error_of(c);
}

// A Qwen3 whose head_dim 16 is not hidden / heads (32 / 4): the q_proj adapter's B is [heads x
// head_dim, r] and o_proj's A [r, heads x head_dim], and dp=2 x tp=2 follows the single-rank run.
TEST(LoraLlama, Qwen3WithHeadDimAdaptsItsWiderProjections) {
  TrainConfig c = llama_lora("dp=1");
  c.model.family = "qwen3";
  c.model.head_dim = 16;
  const LoraRun ref = run_lora(c);
  EXPECT_EQ(ref.grads[0].at("model.layers.0.self_attn.q_proj.lora_B.weight").shape(), (Shape{64, kRank}));
  EXPECT_EQ(ref.grads[0].at("model.layers.0.self_attn.o_proj.lora_A.weight").shape(), (Shape{kRank, 64}));
  EXPECT_EQ(ref.grads[0].at("model.layers.0.self_attn.k_proj.lora_B.weight").shape(), (Shape{32, kRank}));
  // The adapter files (PEFT's keys, lora_key_map) store every adapter as the graph holds it.
  const ckpt::KeyMap keys = lora_key_map(c.model);
  for (const auto& [name, grad] : ref.grads[0]) {
    ASSERT_EQ(keys.placements(name).size(), 1u) << name;
    EXPECT_EQ(keys.placements(name)[0].key_shape, grad.shape()) << name;
  }
  c.parallel.mesh = "dp=2,tp=2";
  expect_same(run_lora(c), ref, "qwen3 head_dim 16");
}

TrainConfig moe_lora(const std::string& mesh, std::vector<std::string> targets = {"all-linear"}) {
  TrainConfig c = llama_lora(mesh, 3, std::move(targets));
  c.model.experts = 4, c.model.top_k = 2, c.model.aux_loss = 0.01;
  c.model.moe_layers = {1};
  return c;
}

// Layer 1 is a MoE layer: all-linear adapts the attention of both layers and layer 0's dense MLP
// (transformers' Mixtral experts are fused parameters, not linear layers: PEFT's target_parameters
// name them, below); ep=2 x tp=2 follows one rank.
TEST(LoraLlama, AMoeModelAdaptsItsAttentionAndRefusesExpertTargets) {
  const LoraRun ref = run_lora(moe_lora("dp=1"));
  ASSERT_EQ(ref.grads[0].size(), 2u * (4 + 4 + 3));
  EXPECT_EQ(ref.grads[0].count("model.layers.1.mlp.gate_proj.lora_A.weight"), 0u);
  // The losses (the experts' sums over ep come in another order: gradients differ by ~1e-7).
  const LoraRun ep = run_lora(moe_lora("ep=2,tp=2"), false);
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(ep.losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << s;
  for (const char* target : {"experts", "w1", "gate", "block_sparse_moe.experts.w2"}) {
    const std::string m = error_of(moe_lora("dp=1", {"q_proj", target}));
    EXPECT_NE(m.find(fmt::format("--lora-targets '{}' names 'model.layers.1.", target)), std::string::npos) << m;
    EXPECT_NE(m.find("whose router and shared expert LoRA does not adapt"), std::string::npos) << m;
    EXPECT_NE(m.find("name experts.gate_up_proj and experts.down_proj"), std::string::npos) << m;
  }
  TrainConfig shared = moe_lora("dp=1");
  shared.model.shared_expert_width = 16;
  EXPECT_NE(error_of(shared).find("--lora-targets all-linear on a model with a shared expert"), std::string::npos)
      << error_of(shared);
}

// The experts' fused parameters as PEFT's target_parameters (lora.h): A [E r, in] split over ep with
// the experts, B [out, E r] replicated. The adapters' gradients and losses on ep=2, dp=2 x ep=2 and
// ep=2 x tp=2 equal the single-rank run's, the experts stay bit-identical, and the adapters have
// PEFT's keys (gate_up_proj's wrapper nested as base_layer when down_proj is adapted too).
TEST(LoraLlama, ExpertParametersAsPeftsTargetParametersTrainOnEveryMeshAsOnOneRank) {
  const std::vector<std::string> targets = {"q_proj", "experts.gate_up_proj", "down_proj"};
  const LoraRun ref = run_lora(moe_lora("dp=1", targets), true, true);
  const std::string m = "model.layers.1.mlp.experts";
  // q_proj's A, B in 2 layers; layer 0's dense down_proj; gate_up's A, B_gate, B_up; the experts' down_proj A, B
  ASSERT_EQ(ref.grads[0].size(), 2u * 2 + 2 + 3 + 2);
  EXPECT_EQ(ref.grads[0].count("model.layers.0.mlp.down_proj.lora_A.weight"), 1u);
  EXPECT_EQ(ref.grads[0].at(m + ".base_layer.lora_A.weight").shape(), (Shape{4 * kRank, 32}));
  EXPECT_EQ(ref.grads[0].at(m + ".gate_up_proj.up.lora_B.weight").shape(), (Shape{64, 4 * kRank}));
  EXPECT_EQ(ref.grads[0].at(m + ".lora_A.weight").shape(), (Shape{4 * kRank, 64}));
  double b_up = 0, a_down = 0;
  for (int64_t i = 0; i < 64 * 4 * kRank; ++i) {
    b_up = std::max(b_up, std::abs(ref.grads[0].at(m + ".gate_up_proj.up.lora_B.weight").at(i)));
    a_down = std::max(a_down, std::abs(ref.grads[1].at(m + ".lora_A.weight").at(i)));
  }
  EXPECT_GT(b_up, 0.0);
  EXPECT_GT(a_down, 0.0);  // B moved at step 1, so A's gradient is not zero at step 2
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  for (const char* w : {"w1", "w2", "w3"}) {
    const std::string name = std::string("model.layers.1.block_sparse_moe.experts.") + w;
    const Tensor &before = ref.frozen_before.at(name), &after = ref.frozen_after.at(name);
    EXPECT_EQ(std::memcmp(before.raw(), after.raw(), before.nbytes()), 0) << name;
  }
  for (const std::string mesh : {"ep=2", "dp=2,ep=2", "ep=2,tp=2"})
    expect_same(run_lora(moe_lora(mesh, targets)), ref, mesh);
  TrainConfig recompute = moe_lora("ep=2", targets);  // the recomputed layer reads the same frozen experts
  recompute.model.recompute = "full";
  const LoraRun again = run_lora(recompute, true, true);
  expect_same(again, ref, "ep=2 + recompute full");
  for (const auto& [name, before] : again.frozen_before)
    EXPECT_EQ(std::memcmp(before.raw(), again.frozen_after.at(name).raw(), before.nbytes()), 0) << name << " changed";
  const GptConfig model = moe_lora("dp=1", targets).model;  // down_proj names a module and the experts' parameter
  EXPECT_EQ(lora_target_modules(model), nlohmann::json({"q_proj", "down_proj"}));
  EXPECT_EQ(lora_target_parameters(model), nlohmann::json({"experts.gate_up_proj", "down_proj"}));
  const ckpt::KeyMap keys = lora_key_map(model);
  const ckpt::KeyPlacement& up = keys.placements(m + ".gate_up_proj.up.lora_B.weight")[0];
  EXPECT_EQ(up.key, "base_model.model." + m + ".base_layer.lora_B.weight");
  EXPECT_EQ(up.key_shape, (Shape{128, 4 * kRank}));
  EXPECT_EQ(up.offset, (std::vector<int64_t>{64, 0}));
  TrainConfig alone = moe_lora("dp=1", {"experts.down_proj"});
  EXPECT_EQ(lora_key_map(alone.model).placements(m + ".lora_A.weight")[0].key, "base_model.model." + m + ".lora_A.weight");
  EXPECT_EQ(lora_target_parameters(alone.model), nlohmann::json({"experts.down_proj"}));
  EXPECT_EQ(lora_target_modules(alone.model), nlohmann::json::array());
  alone.model.lora.dropout = 0.1;
  EXPECT_NE(error_of(alone).find("PEFT's lora.ParamWrapper (target_parameters) refuses lora_dropout"), std::string::npos)
      << error_of(alone);
}

}  // namespace
}  // namespace shardwise::train
