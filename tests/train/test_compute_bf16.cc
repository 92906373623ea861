// train --compute bf16 (models/compute.h): the GEMMs and attention of GPT-2 and Llama read bf16
// operands; the curve is the same on every mesh as on one rank, and stays near the f32 curve.
//
// Tolerances. Meshes: the first step (before any update: the same weights) within 5e-6 relative
// (measured: 0 on pp=2, 5e-8 on dp=2, 1.2e-6 on tp=2 and 3.1e-6 on Mixtral's tp=2, whose partial
// products sum in another order before their bf16 rounding); the 20 steps within 5e-4, as the
// bf16-parameter tests (test_topology, test_pipeline_bf16): masters that differ in the last float
// bit (dp's gradient sums, tp's partial sums) round to neighbouring bf16 operands (2^-8 apart)
// now and then, which moves the loss by 1e-5..2e-4 (measured, 0 on Llama's pp=2). The f32 curve:
// within 3e-3 over 20 steps (measured 2e-4..6e-4: bf16 operands carry 8 significant bits, a
// relative error of up to 2^-9 each that averages out over the products' sums); a missing cast
// shows as no difference at all (checked), a wrong gradient as a curve that leaves it at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "shardwise/models/models.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

constexpr double kFirstStepRtol = 5e-6, kMeshRtol = 5e-4, kF32Rtol = 3e-3;

TrainConfig gpt(const std::string& mesh, DType compute = DType::BF16) {
  TrainConfig c = small_config(mesh, 20);
  c.optimizer.accumulation = 2;  // two micro-batches: a pipeline has work for both stages
  c.model.compute_dtype = compute;
  return c;
}

TrainConfig llama(const std::string& mesh, DType compute = DType::BF16) {
  TrainConfig c = llama_test_config(mesh, 20);
  c.model.compute_dtype = compute;
  return c;
}

// Llama's with a Mixtral MoE MLP in every layer (4 experts, top-2, dropless).
TrainConfig mixtral(const std::string& mesh, DType compute = DType::BF16) {
  TrainConfig c = llama(mesh, compute);
  c.model.experts = 4, c.model.top_k = 2;
  return c;
}

std::vector<double> curve(const TrainConfig& c) { return train_losses(c, c.optimizer.steps, {}, {}); }

void expect_near(const std::vector<double>& got, const std::vector<double>& ref, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(got[i], ref[i], rtol * std::abs(ref[i])) << what << ": step " << i + 1;
    worst = std::max(worst, std::abs(got[i] - ref[i]) / std::abs(ref[i]));
  }
  std::cout << what << ": largest relative difference " << worst << " (allowed " << rtol << "); step 1 "
            << std::abs(got[0] - ref[0]) / std::abs(ref[0]) << "\n";
}

// Whether `v` is a bf16 value widened to f32 (held in f32, rounded to bf16).
bool widened_bf16(const graph::Graph& g, graph::ValueId v) {
  const graph::Value& value = g.value(v);
  if (value.producer < 0) return false;
  const graph::Node& n = g.node(value.producer);
  return n.op == "cast" && g.value(n.inputs[0]).meta.dtype == DType::BF16;
}

// Every matmul, attention core, fused head and MoE layer of the graph reads `dtype` operands (the
// fused head's loss and moe_mlp's output f32 either way: ops/softmax/lm_head.h, ops/moe/kernels.h);
// no operand is a bf16 value widened to f32 (a GEMM computing in f32 on rounded values).
void expect_operands(const GptConfig& c, DType dtype, const std::string& what, const std::string& mesh = "dp=1") {
  const GptGraph gg = build_model(c, Strategy::from_mesh(mesh::parse_mesh(mesh), false), 2, true);
  int checked = 0;
  for (const graph::Node& n : gg.g.nodes()) {
    if (n.kind != graph::NodeKind::Forward) continue;
    if (n.op == "lm_head_cross_entropy" || n.op == "vocab_parallel_lm_head_cross_entropy") {
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(gg.g.value(n.inputs[i]).meta.dtype, dtype) << what << ": " << n.to_string(gg.g);
        EXPECT_FALSE(widened_bf16(gg.g, n.inputs[i])) << what << ": " << n.to_string(gg.g);
      }
      EXPECT_EQ(gg.g.value(n.outputs[0]).meta.dtype, DType::F32) << what;
      ++checked;
    }
    if (n.op == "moe_mlp") {  // x and the experts in `dtype`, the router's gate f32; out f32
      for (size_t i : {0u, 2u, 3u, 4u}) {
        EXPECT_EQ(gg.g.value(n.inputs[i]).meta.dtype, dtype) << what << ": " << n.to_string(gg.g);
        EXPECT_FALSE(widened_bf16(gg.g, n.inputs[i])) << what << ": " << n.to_string(gg.g);
      }
      EXPECT_EQ(gg.g.value(n.inputs[1]).meta.dtype, DType::F32) << what;
      EXPECT_EQ(gg.g.value(n.outputs[0]).meta.dtype, DType::F32) << what;
      ++checked;
    }
    if (n.op != "matmul" && n.op != "flash_attention") continue;
    for (size_t i = 0; i < (n.op == "flash_attention" ? 3u : 2u); ++i)
      EXPECT_EQ(gg.g.value(n.inputs[i]).meta.dtype, dtype) << what << ": " << n.to_string(gg.g);
    ++checked;
  }
  EXPECT_GT(checked, 4) << what;
  EXPECT_EQ(gg.g.value(gg.loss).meta.dtype, DType::F32) << what;
}

TEST(ComputeBf16, GemmsAttentionHeadAndExpertsReadBf16Operands) {
  for (const char* model : {"gpt2", "llama", "mixtral"}) {
    for (bool bf16_params : {false, true}) {
      const std::string name = model;
      TrainConfig c = name == "gpt2" ? gpt("dp=1") : name == "llama" ? llama("dp=1") : mixtral("dp=1");
      c.model.param_dtype = bf16_params ? DType::BF16 : DType::F32;
      const std::string what = name + (bf16_params ? " bf16 params" : "");
      for (const char* mesh : {"dp=1", "dp=2", "tp=2"}) expect_operands(c.model, DType::BF16, what + " " + mesh, mesh);
      c.model.lm_head = "unfused", c.model.attention = "unfused";
      expect_operands(c.model, DType::BF16, what + " unfused");
      c.model.compute_dtype = DType::F32;
      if (!bf16_params) expect_operands(c.model, DType::F32, what + " f32 compute");
    }
  }
}

TEST(ComputeBf16, AnotherComputeDtypeIsRefusedByName) {
  GptConfig c;
  c.compute_dtype = DType::F16;
  try {
    c.validate();
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--compute f16"), std::string::npos) << e.what();
  }
}

void expect_meshes_follow(TrainConfig (*config)(const std::string&, DType), const std::string& model) {
  const std::vector<double> ref = curve(config("dp=1", DType::BF16)), f32 = curve(config("dp=1", DType::F32));
  EXPECT_LT(ref.back(), ref.front() * 0.8) << model << ": the loss should fall";
  expect_near(ref, f32, kF32Rtol, model + " bf16 against f32");
  EXPECT_NE(ref, f32) << model << ": bf16 compute really rounds";
  for (const char* mesh : {"dp=2", "tp=2", "pp=2"}) {
    const std::vector<double> got = curve(config(mesh, DType::BF16));
    expect_near(got, ref, kMeshRtol, model + " " + mesh);
    EXPECT_NEAR(got[0], ref[0], kFirstStepRtol * ref[0]) << model << " " << mesh << ": the first step";
  }
  // Sequence parallelism: Llama casts each norm output to bf16 on its sequence shard, gathers it,
  // and gathers it again for the backward (the matmuls in a recompute segment).
  TrainConfig sp = config("tp=2", DType::BF16);
  sp.parallel.sequence_parallel = true;
  expect_near(curve(sp), ref, kMeshRtol, model + " tp=2 sp");
  TrainConfig params = config("dp=1", DType::BF16);
  params.bf16 = true;
  expect_near(curve(params), f32, kF32Rtol, model + " bf16 params and compute against f32");
}

TEST(ComputeBf16, Gpt2CurveIsTheSameOnEveryMeshAndNearF32) { expect_meshes_follow(gpt, "gpt2"); }

TEST(ComputeBf16, LlamaCurveIsTheSameOnEveryMeshAndNearF32) { expect_meshes_follow(llama, "llama"); }

// The experts' GEMMs read bf16 tokens and weights (moe_mlp: f32 sums, bf16 operands).
TEST(ComputeBf16, MixtralCurveIsTheSameOnEveryMeshAndNearF32) { expect_meshes_follow(mixtral, "mixtral"); }

}  // namespace
}  // namespace shardwise::train
