// Context parallelism (a cp mesh dim): the same 20 training steps with every activation's sequence
// split over cp (in cp's balanced order; attention by ring_attention, or with --cp-attention gather
// flash_attention on gathered k, v) follow the single-rank loss
// curve, GPT-2 and Llama, alone and with tp, sp, dp, pp and sharding stage 2; held-out predictions
// come back in the natural order; checkpoints of cp runs resume on any mesh; what cp does not
// compose with yet is refused by name. (Packed
// documents on cp: tests/data/test_packing.cc, against each document alone.)
#include <gtest/gtest.h>

#include <filesystem>

#include "shardwise/ckpt/commit.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/models/models.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"
#include "tests/support/train_losses.h"
#include "shardwise/train/context_parallel.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

// 16 tokens: 2 x cp chunks for cp up to 8.
TrainConfig gpt(const std::string& mesh) {
  TrainConfig c = small_config(mesh, 20);
  c.model.seq = 16;
  return c;
}
TrainConfig llama(const std::string& mesh) {
  TrainConfig c = llama_test_config(mesh, 20);
  c.model.seq = 16;
  return c;
}

struct Curve {
  std::vector<double> losses;
  EvalResult eval;
  std::vector<MoeStepStats> moe;  // every step's, layer after layer
};
Curve run(TrainConfig c, int ranks) {
  Curve out;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& world) {
    Trainer t(c, world.group(world.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      StepResult r = t.step();
      if (world.rank() != 0) continue;
      out.losses.push_back(r.loss);
      out.moe.insert(out.moe.end(), r.moe.begin(), r.moe.end());
    }
    EvalResult e = t.evaluate();
    if (world.rank() == 0) out.eval = e;
  });
  return out;
}

void expect_same_run(const Curve& got, const Curve& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << ": step " << i + 1;
  EXPECT_EQ(got.eval.problems, ref.eval.problems) << what;
  EXPECT_EQ(got.eval.exact, ref.eval.exact) << what << ": held-out answers";
  ASSERT_EQ(got.moe.size(), ref.moe.size()) << what;
  for (size_t i = 0; i < ref.moe.size(); ++i) {  // the router losses: means over every token of the batch
    const std::string at = fmt::format("{}: step {} layer {}", what, i / 2 + 1, ref.moe[i].layer);
    EXPECT_NEAR(got.moe[i].aux_loss, ref.moe[i].aux_loss, 1e-5 * ref.moe[i].aux_loss) << at;
    EXPECT_NEAR(got.moe[i].z_loss, ref.moe[i].z_loss, 1e-5 * ref.moe[i].z_loss) << at;
    EXPECT_EQ(got.moe[i].dropped, ref.moe[i].dropped) << at;
  }
}

void expect_cp_meshes_follow(TrainConfig (*config)(const std::string&), const std::string& what) {
  const Curve ref = run(config("dp=1"), 1);
  ASSERT_LT(ref.losses.back(), ref.losses.front() * 0.8) << what << ": the loss should fall";
  for (const auto& [mesh, ranks] : std::vector<std::pair<std::string, int>>{
           {"cp=2", 2}, {"cp=4", 4}, {"cp=2,tp=2", 4}, {"dp=2,cp=2", 4}, {"cp=2,pp=2", 4}}) {
    expect_same_run(run(config(mesh), ranks), ref, what + " " + mesh);
  }
  TrainConfig sp = config("tp=2,cp=2");
  sp.parallel.sequence_parallel = true;
  expect_same_run(run(sp, 4), ref, what + " tp=2,cp=2 + sp");
  TrainConfig stage2 = config("dp=2,cp=2");  // gradients reduce-scattered over dp x cp
  stage2.parallel.sharding.stage = 2;
  expect_same_run(run(stage2, 4), ref, what + " dp=2,cp=2 --sharding-stage 2");
  for (const auto& [mesh, ranks] : std::vector<std::pair<std::string, int>>{{"cp=2", 2}, {"dp=2,cp=2", 4}}) {
    TrainConfig stage3 = config(mesh);  // parameters stored sharded over dp x cp, gathered per layer
    stage3.parallel.sharding.stage = 3;
    expect_same_run(run(stage3, ranks), ref, what + " " + mesh + " --sharding-stage 3");
  }
  // The all-gather variant: k, v gathered over cp instead of passed around the ring.
  for (const auto& [mesh, ranks] : std::vector<std::pair<std::string, int>>{{"cp=2", 2}, {"cp=4", 4}, {"cp=2,tp=2", 4}}) {
    TrainConfig gather = config(mesh);
    gather.model.cp_attention = "gather";
    expect_same_run(run(gather, ranks), ref, what + " " + mesh + " --cp-attention gather");
  }
}

// The unfused attention core: the [S, S] causal mask constant in cp's order, the scores' query
// rows sharded with it.
TEST(ContextParallel, UnfusedAttentionOnCpFollowsTheSingleRankCurve) {
  TrainConfig c = gpt("dp=1");
  c.model.attention = "unfused";
  const Curve ref = run(c, 1);
  c.parallel.mesh = "cp=2";
  expect_same_run(run(c, 2), ref, "unfused cp=2");
}

TEST(ContextParallel, GptLossCurvesOnCpMeshesFollowTheSingleRankCurve) { expect_cp_meshes_follow(gpt, "gpt2"); }
TEST(ContextParallel, LlamaLossCurvesOnCpMeshesFollowTheSingleRankCurve) { expect_cp_meshes_follow(llama, "llama"); }

// Mixtral-style MoE layers (4 experts, top-2, aux and z losses) on cp: the sequence-sharded tokens
// are routed where they are (the layer's [B * S, H] tokens chunk-major, sharded over cp and the
// data dims), the router's means over tokens are global (the kernel's all-gather over every dim
// sharding them), and the experts' gradients are summed over cp like every parameter's. cp alone
// (experts replicated), with ep (tokens over cp x ep, the all-to-alls over ep, in either mesh
// order), with dp, dp x cp x ep on 8 ranks, with pp (the first stage's router losses as its extra
// loss) and with tp follow the single-rank curve, router losses too; so
// do the pooled (model-scope) aux loss on dp x cp, a shared expert on cp x ep, and cp x ep at
// sharding stage 3.
TrainConfig moe(const std::string& mesh) {
  TrainConfig c = llama(mesh);
  c.model.experts = 4, c.model.top_k = 2, c.model.aux_loss = 0.01, c.model.router_z_loss = 0.001;
  return c;
}

TEST(ContextParallel, MoeCurvesOnCpMeshesFollowTheSingleRankCurve) {
  const Curve ref = run(moe("dp=1"), 1);
  ASSERT_EQ(ref.moe.size(), 40u) << "2 MoE layers x 20 steps";
  ASSERT_LT(ref.losses.back(), ref.losses.front() * 0.8) << "the loss should fall";
  for (const auto& [mesh, ranks] : std::vector<std::pair<std::string, int>>{
           {"cp=2", 2}, {"cp=2,ep=2", 4}, {"ep=2,cp=2", 4}, {"dp=2,cp=2", 4}, {"dp=2,cp=2,ep=2", 8}, {"cp=2,pp=2", 4},
           {"tp=2,cp=2", 4}}) {
    expect_same_run(run(moe(mesh), ranks), ref, "moe " + mesh);
  }
  TrainConfig stage3 = moe("cp=2,ep=2");  // dense parameters stored over cp x ep, the experts' over cp
  stage3.parallel.sharding.stage = 3;
  expect_same_run(run(stage3, 4), ref, "moe cp=2,ep=2 --sharding-stage 3");
  TrainConfig pooled = moe("dp=1");  // transformers' load-balancing loss of the pooled layers
  pooled.model.aux_loss_scope = "model";
  const Curve pooled_ref = run(pooled, 1);
  pooled.parallel.mesh = "dp=2,cp=2";
  expect_same_run(run(pooled, 4), pooled_ref, "moe --aux-loss-scope model dp=2,cp=2");
  TrainConfig shared = moe("dp=1");  // a Qwen-MoE shared expert beside the routed ones
  shared.model.shared_expert_width = 32;
  const Curve shared_ref = run(shared, 1);
  shared.parallel.mesh = "cp=2,ep=2";
  expect_same_run(run(shared, 4), shared_ref, "moe + shared expert cp=2,ep=2");
}

// The lowered MoE training program on cp meshes: the layer's tokens stay where the sequence shards
// put them (co-sharded over cp and the data dims, B * S / ranks rows a rank), and no collective
// is inserted but the gradients' all-reduces (gathering the tokens over cp would add all-gathers).
TEST(ContextParallel, MoeTokensStayShardedOverCpAndTheDataDims) {
  for (const auto& [mesh, dist] : std::vector<std::pair<std::string, std::string>>{
           {"cp=2", "S(0)"}, {"dp=2,cp=2", "S(0)@1,S(0)@0"}, {"cp=2,ep=2", "S(0),S(0)"}}) {
    TrainConfig c = moe(mesh);
    const mesh::Strategy s = mesh::Strategy::from_mesh(mesh::parse_mesh(mesh), false);
    c.check(static_cast<int>(s.mesh.size()), false);
    const int64_t B = c.optimizer.micro_batch * s.data_size();
    GptGraph gpt = build_model(kernel_model(c), s, B);
    graph::append_backward(gpt.g, gpt.loss);
    graph::Program p = graph::lower(gpt.g, graph::complete(gpt.g, s.mesh));
    for (const char* layer : {"model.layers.0", "model.layers.1"}) {
      const graph::ValueId v = gpt.g.get(std::string(layer) + ".block_sparse_moe.tokens");
      const graph::Slot& t = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])];
      EXPECT_EQ(t.dist.to_string(), dist) << mesh << " " << layer;
      const int64_t ranks = s.mesh.size();
      EXPECT_EQ(mesh::local_shape(t.meta.shape, t.dist, s.mesh, s.mesh.coords(ranks - 1)),
                (Shape{B * c.model.seq / ranks, c.model.hidden}))
          << mesh << " " << layer;
    }
    for (const auto& [kind, count] : p.collective_counts()) EXPECT_EQ(kind, "all_reduce") << mesh << ": " << count;
  }
}

// Capacity mode (0.75, layer 1) on cp=2: the capacity C is global and each expert's assignments
// are the router's, so the step-1 drops equal one rank's; which assignments are dropped follows
// the order the layer sees the tokens in (cp's chunk-major order, not the natural one), so the
// curve is its own and still falls.
TEST(ContextParallel, MoeCapacityOnCpDropsAsManyAssignmentsAsOneRank) {
  TrainConfig c = moe("dp=1");
  c.model.moe_layers = {1}, c.model.capacity_factor = 0.75;
  const Curve ref = run(c, 1);
  c.parallel.mesh = "cp=2";
  const Curve got = run(c, 2);
  ASSERT_EQ(ref.moe.size(), 20u);
  ASSERT_EQ(got.moe.size(), 20u);
  EXPECT_GT(ref.moe[0].dropped, 0) << "capacity 0.75 must drop assignments";
  EXPECT_EQ(got.moe[0].dropped, ref.moe[0].dropped);
  EXPECT_NEAR(got.moe[0].aux_loss, ref.moe[0].aux_loss, 1e-5 * ref.moe[0].aux_loss);
  EXPECT_LT(got.losses.back(), got.losses.front() * 0.8) << "the loss should fall";
}

// cp's order of a sequence of 8 over 2 ranks: chunks of 2, rank 0 holding chunks 0 and 3, rank 1
// chunks 1 and 2; from_cp_order undoes it (predictions come back in the natural order).
TEST(ContextParallel, RowsGoIntoCpsOrderAndBack) {
  Tensor rows(DType::I64, Shape{2, 8});
  for (int64_t i = 0; i < 16; ++i) rows.data<int64_t>()[i] = 100 * (i / 8) + i % 8;
  const Tensor z = to_cp_order(rows, 2);
  const int64_t want[8] = {0, 1, 6, 7, 2, 3, 4, 5};
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t x = 0; x < 8; ++x) EXPECT_EQ(z.data<int64_t>()[r * 8 + x], 100 * r + want[x]) << r << ", " << x;
  const Tensor back = from_cp_order(z, 2);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(back.data<int64_t>()[i], rows.data<int64_t>()[i]) << i;
  EXPECT_EQ(to_cp_order(rows, 1).data<int64_t>()[3], 3);  // one rank: the natural order
}

// A checkpoint saved on cp=2 holds whole-tensor files like any other mesh's: resumed on one rank,
// tp=2 or dp=2 x cp=2 the curve continues; one saved on one rank resumes on cp=4, and one saved on
// dp=2 x cp=2 at stage 3 on one rank.
TEST(ContextParallel, CheckpointsOfCpRunsResumeOnAnyMesh) {
  const std::vector<double> whole = train_losses(llama("dp=1"), 12, {}, {});
  const auto dir = [](const std::string& name) {
    const std::filesystem::path d = std::filesystem::temp_directory_path() / ("shardwise-cp-resume-" + name);
    std::filesystem::remove_all(d);
    return d;
  };
  for (const auto& [saved_on, resumed_on] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"cp=2", {"dp=1", "tp=2", "dp=2,cp=2"}}, {"dp=1", {"cp=4"}}}) {
    const std::filesystem::path root = dir(saved_on);
    const std::vector<double> first = train_losses(llama(saved_on), 6, {}, root);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_NEAR(first[i], whole[i], 1e-5 * whole[i]) << saved_on;
    const auto found = ckpt::find_resume(root);
    ASSERT_TRUE(found.has_value()) << saved_on;
    for (const std::string& mesh : resumed_on) {
      const std::vector<double> rest = train_losses(llama(mesh), 6, found->dir, {});
      ASSERT_EQ(rest.size(), 6u);
      for (size_t i = 0; i < rest.size(); ++i)
        EXPECT_NEAR(rest[i], whole[6 + i], 1e-5 * whole[6 + i]) << "saved on " << saved_on << ", resumed on " << mesh
                                                                  << ", step " << 7 + i;
    }
  }
  // Parameters stored sharded over dp x cp (stage 3) save whole tensors too: resumed on one rank.
  TrainConfig stage3 = llama("dp=2,cp=2");
  stage3.parallel.sharding.stage = 3;
  const std::filesystem::path root = dir("stage3");
  const std::vector<double> first = train_losses(stage3, 6, {}, root);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_NEAR(first[i], whole[i], 1e-5 * whole[i]) << "stage 3";
  const auto found = ckpt::find_resume(root);
  ASSERT_TRUE(found.has_value());
  const std::vector<double> rest = train_losses(llama("dp=1"), 6, found->dir, {});
  ASSERT_EQ(rest.size(), 6u);
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_NEAR(rest[i], whole[6 + i], 1e-5 * whole[6 + i]) << "saved on dp=2,cp=2 stage 3, step " << 7 + i;
}

std::string refusal(TrainConfig c, int ranks) {
  try {
    c.check(ranks, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ContextParallel, WhatDoesNotComposeYetIsRefusedByName) {
  TrainConfig odd = gpt("cp=4");
  odd.model.seq = 12;
  EXPECT_NE(refusal(odd, 4).find("--seq 12 does not split over cp=4"), std::string::npos) << refusal(odd, 4);
  TrainConfig ring = gpt("cp=2");
  ring.model.cp_attention = "rings";
  EXPECT_NE(refusal(ring, 2).find("--cp-attention 'rings' is not a context-parallel attention (ring, gather)"),
            std::string::npos);
  TrainConfig packed = gpt("cp=2");
  packed.model.attention = "unfused", packed.data.document_attention = true;
  EXPECT_NE(refusal(packed, 2).find("with packed documents (--no-cross-document-attention) needs --attention fused"),
            std::string::npos)
      << refusal(packed, 2);
}

}  // namespace
}  // namespace shardwise::train
