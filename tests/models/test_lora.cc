// LoRA training (models/lora.h) on the small GPT of the trainer tests, its base from the seeded
// initialization: the adapters' gradients and the loss curve on dp=2, tp=2 and dp=2 x tp=2 (and
// sp, pp) equal the single-rank run's; the frozen base stays bit-identical; the optimizer holds
// state for the adapters only; with B = 0 the first loss is the base model's.
#include <gtest/gtest.h>

#include <cstring>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "tests/support/lora_run.h"
#include "tests/support/small_config.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

constexpr int64_t kRank = 4;

TrainConfig lora(const std::string& mesh, int64_t steps) {
  TrainConfig c = small_config(mesh, steps);
  c.model.lora.rank = kRank;
  c.model.lora.alpha = 8;
  c.model.lora.targets = {"c_attn", "c_proj", "c_fc"};  // c_proj: attn.c_proj and mlp.c_proj
  c.optimizer.lr = 1e-2;
  return c;
}

TEST(Lora, AdapterGradientsAndLossesOnEveryMeshEqualTheSingleRankRun) {
  const LoraRun ref = run_lora(lora("dp=1", 3));
  ASSERT_EQ(ref.grads.size(), 3u);
  ASSERT_EQ(ref.grads[0].size(), 20u);  // per layer: A and B_q, B_k, B_v of c_attn, A and B of three more
  // Step 1: B = 0, so A takes no gradient yet and B does; step 2 on, both train.
  double a1 = 0, b1 = 0, a2 = 0;
  for (int64_t i = 0; i < kRank * 32; ++i) {
    a1 = std::max(a1, std::abs(ref.grads[0].at("transformer.h.0.attn.c_attn.lora_A.weight").at(i)));
    a2 = std::max(a2, std::abs(ref.grads[1].at("transformer.h.0.attn.c_attn.lora_A.weight").at(i)));
    b1 = std::max(b1, std::abs(ref.grads[0].at("transformer.h.1.mlp.c_proj.lora_B.weight").at(i)));
  }
  EXPECT_EQ(a1, 0.0);
  EXPECT_GT(a2, 0.0);
  EXPECT_GT(b1, 0.0);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  for (const std::string mesh : {"dp=2", "tp=2", "dp=2,tp=2"}) expect_same(run_lora(lora(mesh, 3)), ref, mesh);
  TrainConfig sp = lora("tp=2", 3);
  sp.parallel.sequence_parallel = true;
  expect_same(run_lora(sp), ref, "tp=2 + sp");
  TrainConfig pipeline = lora("pp=2", 3);
  pipeline.optimizer.accumulation = 2;  // two micro-batches of 4 through two stages: the mean is the same
  LoraRun pp = run_lora(pipeline, false);
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(pp.losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << s;
}

// The adapters' optimizer state sharded over dp (stage 2 v2, stage 1 v1): the single-rank losses and
// whole gradients (Trainer::gather_grad gathers the shards), the frozen base untouched.
TEST(Lora, ShardedAdapterStateFollowsTheSingleRankRun) {
  const LoraRun ref = run_lora(lora("dp=1", 3));
  for (auto [stage, layout] : {std::pair{2, "v2"}, std::pair{1, "v1"}}) {
    TrainConfig c = lora("dp=2,tp=2", 3);
    c.parallel.sharding = {stage, layout};
    expect_same(run_lora(c), ref, fmt::format("dp=2,tp=2 stage {} {}", stage, layout));
  }
}

TEST(Lora, FrozenWeightsStayBitIdenticalAndTheOptimizerHoldsTheAdaptersOnly) {
  const LoraRun r = run_lora(lora("dp=2,tp=2", 4), false, true);
  ASSERT_EQ(r.frozen_before.size(), 36u);  // every base parameter of 2 layers
  for (const auto& [name, before] : r.frozen_before) {
    const Tensor& after = r.frozen_after.at(name);
    EXPECT_TRUE(before.shape() == after.shape() && std::memcmp(before.raw(), after.raw(), before.nbytes()) == 0)
        << name << " changed";
  }
  // Adapters per layer, hidden H = 32: c_attn A [r, H] + B [3H, r]; attn.c_proj A [r, H] + B [H, r];
  // c_fc A [r, H] + B [4H, r]; mlp.c_proj A [r, 4H] + B [H, r].
  const int64_t H = 32, adapters = 2 * kRank * H * (1 + 3 + 1 + 1 + 1 + 4 + 4 + 1);
  EXPECT_EQ(r.counts.trained, adapters);
  EXPECT_EQ(r.counts.frozen, 2 * (12 * H * H + 13 * H) + 128 * H + 10 * H + 2 * H);
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    Trainer t(lora("dp=2,tp=2", 1), w.group(w.members()));
    int64_t local = 0;
    for (const ParamState& p : t.params()) {
      EXPECT_TRUE(is_lora_param(p.name)) << p.name << " is trained";
      EXPECT_EQ(p.exp_avg.numel(), p.param.numel());
      local += p.param.numel();
    }
    for (const ParamState& p : t.frozen()) {
      EXPECT_FALSE(p.exp_avg.defined() || p.exp_avg_sq.defined() || p.master.defined()) << p.name;
    }
    EXPECT_EQ(t.optimizer_state_bytes(), 8 * local);  // exp_avg and exp_avg_sq, f32
    // The adapters shard like their base: B on the output dim of a column-parallel base, A on the
    // input dim of a row-parallel one (mesh [dp, tp]).
    std::map<std::string, std::string> dist;
    for (const ParamState& p : t.params()) dist[p.name] = p.dist.to_string();
    EXPECT_EQ(dist.at("transformer.h.0.attn.c_attn.lora_A.weight"), "R,R");
    EXPECT_EQ(dist.at("transformer.h.0.attn.v_proj.lora_B.weight"), "R,S(0)");
    EXPECT_EQ(dist.at("transformer.h.0.mlp.c_fc.lora_B.weight"), "R,S(0)");
    EXPECT_EQ(dist.at("transformer.h.1.attn.c_proj.lora_A.weight"), "R,S(1)");
    EXPECT_EQ(dist.at("transformer.h.1.mlp.c_proj.lora_A.weight"), "R,S(1)");
    EXPECT_EQ(dist.at("transformer.h.1.mlp.c_proj.lora_B.weight"), "R,R");
    EXPECT_LT(local, adapters);  // tp shards the adapters too
  });
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Trainer t(lora("dp=1", 1), w.group(w.members()));
    EXPECT_EQ(t.optimizer_state_bytes(), 8 * adapters);
  });
}

TEST(Lora, WithBZeroTheFirstLossIsTheBaseModelsLoss) {
  TrainConfig base = small_config("dp=1", 1);
  base.optimizer.lr = 1e-2;
  const double want = run_lora(base, false).losses[0];
  EXPECT_EQ(run_lora(lora("dp=1", 1), false).losses[0], want);
  EXPECT_NEAR(run_lora(lora("dp=2,tp=2", 1), false).losses[0], want, 1e-6 * want);
}

TEST(Lora, TargetsFollowPeftAndBadConfigurationsAreNamed) {
  LoraConfig l;
  l.targets = {"c_proj"};
  EXPECT_TRUE(l.targets_module("transformer.h.1.attn.c_proj"));
  EXPECT_TRUE(l.targets_module("transformer.h.1.mlp.c_proj"));
  EXPECT_FALSE(l.targets_module("transformer.h.1.mlp.c_fc"));
  l.targets = {"attn.c_proj"};
  EXPECT_FALSE(l.targets_module("transformer.h.1.mlp.c_proj"));
  l.targets.clear(), l.target_regex = R"(.*\.1\.mlp\.c_fc)";
  EXPECT_TRUE(l.targets_module("transformer.h.1.mlp.c_fc"));
  EXPECT_FALSE(l.targets_module("transformer.h.0.mlp.c_fc"));
  auto error_of = [](const TrainConfig& c) -> std::string {
    try {
      TrainConfig copy = c;
      copy.check(1);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TrainConfig c = lora("dp=1", 1);
  c.model.lora.targets = {"c_attn", "q_proj"};
  EXPECT_NE(error_of(c).find("--lora-targets 'q_proj' names no module of the model"), std::string::npos) << error_of(c);
  c.model.lora.targets = {"wte"};
  EXPECT_NE(error_of(c).find("names 'transformer.wte', which LoRA does not adapt here"), std::string::npos)
      << error_of(c);
  c.model.lora.targets = {"c_attn"};
  c.model.lora.rank = -2;
  EXPECT_NE(error_of(c).find("--lora-rank must be at least 1, got -2"), std::string::npos) << error_of(c);
  c.model.lora.rank = 2, c.model.lora.dropout = 1;
  EXPECT_NE(error_of(c).find("--lora-dropout must be in [0, 1), got 1"), std::string::npos) << error_of(c);
}

// bf16: the frozen base is held in bf16 only (no fp32 master), the adapters in bf16 with fp32
// masters; other meshes follow the single-rank curve (to bf16's tolerance, as for full training).
TEST(Lora, Bf16BaseStaysFrozenInBf16AndMeshesFollowOneRank) {
  TrainConfig c = lora("dp=1", 3);
  c.bf16 = true;
  const LoraRun ref = run_lora(c, false, true);
  for (const auto& [name, before] : ref.frozen_before) {
    const Tensor& after = ref.frozen_after.at(name);
    EXPECT_EQ(std::memcmp(before.raw(), after.raw(), before.nbytes()), 0) << name << " changed";
  }
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (const ParamState& p : t.frozen()) EXPECT_EQ(p.param.dtype(), DType::BF16) << p.name;
    for (const ParamState& p : t.params()) EXPECT_EQ(p.master.dtype(), DType::F32) << p.name;
  });
  c.parallel.mesh = "dp=2,tp=2";
  const LoraRun mesh = run_lora(c, false);
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(mesh.losses[s], ref.losses[s], 5e-4 * ref.losses[s]) << s;
}

// rsLoRA scales by alpha / sqrt(r); lora_dropout draws masks per sample (the curve still follows
// the single-rank one on a mesh, as GPT-2's dropout does).
TEST(Lora, RsLoraAndLoraDropoutOnAMesh) {
  LoraConfig l;
  l.rank = 16, l.alpha = 8, l.rslora = true;
  EXPECT_DOUBLE_EQ(l.scale(), 2.0);
  l.rslora = false;
  EXPECT_DOUBLE_EQ(l.scale(), 0.5);
  TrainConfig c = lora("dp=1", 3);
  c.model.lora.dropout = 0.2;
  c.model.lora.rslora = true;
  const LoraRun ref = run_lora(c, false), plain = run_lora(lora("dp=1", 3), false);
  EXPECT_NE(ref.losses[2], plain.losses[2]);
  c.parallel.mesh = "dp=2,tp=2";
  const LoraRun mesh = run_lora(c, false);
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(mesh.losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << s;
}

}  // namespace
}  // namespace shardwise::train
