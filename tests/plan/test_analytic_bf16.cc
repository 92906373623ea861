// The analytic model under bf16 compute (ModelSize::bf16_compute, `--compute bf16`): the GEMMs at
// the bf16 peak, and a frame's bytes counted tensor by tensor by hand on toy models. The compiled
// programs' memory plan is the other reference (tests/cli/plan/test_plan_analytic_bf16.cc).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "shardwise/plan/analytic.h"
#include "shardwise/plan/cost.h"

namespace shardwise::plan {
namespace {

ClusterSpec cluster() {
  ClusterSpec c;
  c.name = "toy", c.nodes = 1, c.devices_per_node = 8;
  c.peak_flops = {{"f32", 1e9}, {"tf32", 2e9}, {"bf16", 4e9}};
  c.memory_bytes = 1e12, c.memory_bandwidth = 1e300;
  c.intra_node = {1e300, 0};
  c.inter_node = {1e300, 0};
  return c;
}

// 1 layer, hidden 8, 2 heads of 4, vocabulary 16, seq 4; GPT-2's MLP of 32 or Llama's SwiGLU of
// 24 with 1 key/value head.
ModelSize gpt() {
  ModelSize m;
  m.layers = 1, m.heads = 2, m.kv_heads = 2, m.head_dim = 4, m.hidden = 8, m.mlp_width = 32, m.vocab = 16, m.seq = 4;
  m.bf16_compute = true;
  return m;
}
ModelSize llama() {
  ModelSize m = gpt();
  m.kv_heads = 1, m.mlp_width = 24, m.swiglu = true, m.tied = false;
  return m;
}

Candidate on(int64_t tp, bool sp) {
  Candidate c;
  c.tp = tp, c.sequence_parallel = sp, c.micro_batch = 1, c.accumulation = 1;
  return c;
}

// The GEMMs run at the bf16 peak under bf16 compute and at the f32 one otherwise, whatever the
// parameters' dtype (--bf16 alone stores them in bf16; the kernels compute in f32).
TEST(AnalyticBf16, GemmsRunAtTheComputeDtypesPeak) {
  ModelSize m = gpt();
  EXPECT_EQ(gemm_dtype(m, "bf16"), "bf16");
  EXPECT_EQ(gemm_dtype(m, "f32"), "bf16");
  m.bf16_compute = false;
  EXPECT_EQ(gemm_dtype(m, "bf16"), "f32");
  EXPECT_EQ(gemm_dtype(m, "tf32"), "tf32");
  const StepEstimate f32 = analytic_estimate(cluster(), m, on(1, false), 1, "bf16");
  m.bf16_compute = true;
  const StepEstimate bf16 = analytic_estimate(cluster(), m, on(1, false), 1, "bf16");
  EXPECT_DOUBLE_EQ(bf16.flops, f32.flops);
  EXPECT_NEAR(bf16.parts.at("compute") * 4, f32.parts.at("compute"), 1e-15);
  EXPECT_NEAR(bf16.mfu, f32.mfu, 1e-12);  // each against its own peak
}

// One micro-batch of 1 sequence of 4 tokens on tp=2, bf16 parameters, stage 0: the state (2 + 4
// + 8 + 4 bytes a parameter) plus the layer's frame, or the last stage's f32 logits beside it.
// sbh = 32. GPT-2 keeps q, k, v, the attention output and the projection's input in bf16
// (2 x 5 x sbh / t), the first MLP matmul's f32 output and the GELU's bf16 output ((4 + 2) x 4
// sbh / t), the layer input and the attention residual in f32 and both LayerNorm outputs in bf16
// (8 + 4: whole without sp, over t with it). Llama: q, the output and the projection's input in
// bf16 (6 sbh / t), k and v of its one kv head (2 x 2 x sbh / 2 / t), gate and up in f32 and their
// product in bf16 (10 x 3 sbh / t), the stream and both RMSNorm outputs in f32 (16), and without
// sp the norms' bf16 copies whole (4).
TEST(AnalyticBf16, AFramesBytesAreItsTensorsCountedByHand) {
  const double sbh = 4 * 8, t = 2;
  struct Case {
    ModelSize m;
    bool sp;
    double layer;
  };
  const std::vector<Case> cases = {
      {gpt(), false, sbh * (12 + (10 + 24) / t)},
      {gpt(), true, sbh * (12 + 10 + 24) / t},
      {llama(), false, sbh * (20 + (6 + 2 + 30) / t)},
      {llama(), true, sbh * (16 + 6 + 2 + 30) / t},
  };
  for (const Case& k : cases) {
    const ModelSize& m = k.m;
    const double layer_params = (m.swiglu ? 8 * 4 * 4 + 8 * 8 + 3 * 8 * 24 : 8 * 24 + 8 * 8 + 2 * 8 * 32) / t + 2 * 8;
    const double params = layer_params + 16 * 8 / t;  // a rank's layer and head (the last stage's)
    const double head = 4 * 4 * 16 / t;
    SCOPED_TRACE(fmt::format("{} sp {}", m.swiglu ? "llama" : "gpt2", k.sp));
    EXPECT_EQ(analytic_memory(m, on(2, k.sp), 1, "bf16"), static_cast<int64_t>(18 * params + k.layer + head));
    // f32 parameters: the bf16 copy of each weight the backward reads, 2 bytes a parameter.
    EXPECT_EQ(analytic_memory(m, on(2, k.sp), 1, "f32"),
              static_cast<int64_t>(16 * params + k.layer + 2 * layer_params + head));
  }
}

}  // namespace
}  // namespace shardwise::plan
