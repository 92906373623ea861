// The analytic per-layer model (plan/analytic.h) on toy models whose step and memory are worked out
// by hand from its stated formulas.
#include <gtest/gtest.h>

#include "shardwise/plan/analytic.h"
#include "shardwise/plan/cost.h"

namespace shardwise::plan {
namespace {

ClusterSpec cluster(double peak, double link_bandwidth, double memory_bandwidth = 1e300) {
  ClusterSpec c;
  c.name = "toy", c.nodes = 2, c.devices_per_node = 4;
  c.peak_flops = {{"f32", peak}, {"tf32", peak}, {"bf16", peak}};
  c.memory_bytes = 1e12, c.memory_bandwidth = memory_bandwidth;
  c.intra_node = {link_bandwidth, 0};
  c.inter_node = {link_bandwidth / 10, 0};
  return c;
}

// 1 layer, hidden 8, 2 heads of 4, GPT-2's MLP of 32, vocabulary 16, seq 4.
ModelSize toy() {
  ModelSize m;
  m.layers = 1, m.heads = 2, m.kv_heads = 2, m.head_dim = 4, m.hidden = 8, m.mlp_width = 32, m.vocab = 16, m.seq = 4;
  return m;
}

Candidate one(int64_t dp, int64_t tp, int64_t micro_batch, int64_t accumulation) {
  Candidate c;
  c.dp = dp, c.tp = tp, c.micro_batch = micro_batch, c.accumulation = accumulation;
  return c;
}

TEST(Analytic, ComputeIsTheCountedFlopsOverThePeak) {
  // A layer's forward on b=2: 2bs (h (3 x 8) + 8 x 8) (attention) + 4 b s^2 (8) (scores) + 2bs (2 x 8 x 32) (MLP);
  // the head 2bs h V; backward twice; 3 micro-batches.
  const double b = 2, s = 4;
  const double layer = 2 * b * s * (8 * 24 + 64) + 4 * b * s * s * 8 + 2 * b * s * (2 * 8 * 32);
  const double forward = layer + 2 * b * s * 8 * 16;
  const StepEstimate e = analytic_estimate(cluster(1e9, 1e300), toy(), one(1, 1, 2, 3), 6, "f32");
  EXPECT_DOUBLE_EQ(e.flops, 3 * 3 * forward);
  EXPECT_NEAR(e.parts.at("compute"), 3 * 3 * forward / 1e9, 1e-15);
  EXPECT_NEAR(e.step, e.parts.at("compute"), 1e-12);  // nothing else costs time here
  EXPECT_NEAR(e.mfu, 1, 1e-9);
  // Full recompute: one forward of the layer (not the head) more in each backward.
  Candidate rc = one(1, 1, 2, 3);
  rc.recompute = "full";
  EXPECT_DOUBLE_EQ(analytic_estimate(cluster(1e9, 1e300), toy(), rc, 6, "f32").flops, 3 * (3 * forward + layer));
}

TEST(Analytic, TpAllReducesAndTheGradientSyncAreRings) {
  const ClusterSpec c = cluster(1e300, 1e9);
  // tp=2: 4 all-reduces of b s h f32 bytes a layer a micro-batch, over the intra-node link.
  const double act = 2 * 4 * 8 * 4.0;
  const StepEstimate tp = analytic_estimate(c, toy(), one(1, 2, 2, 1), 2, "f32");
  EXPECT_NEAR(tp.parts.at("tp_all_reduce"), 4 * collective_seconds(CollectiveKind::AllReduce, act, 2, c.intra_node), 1e-15);
  // dp=8 (two nodes): one all-reduce of the f32 gradients over the inter-node link.
  const double params = 8 * 24 + 64 + 2 * 8 * 32 + 2 * 8 + 16 * 8;
  const StepEstimate dp = analytic_estimate(c, toy(), one(8, 1, 1, 1), 8, "f32");
  EXPECT_NEAR(dp.parts.at("grad_sync"),
              collective_seconds(CollectiveKind::AllReduce, 4 * params, 8, c.inter_node), 1e-15);
}

TEST(Analytic, MemoryIsTheStateAndTheActivationsByHand) {
  const double params = 8 * 24 + 64 + 2 * 8 * 32 + 2 * 8 + 16 * 8;
  // f32, dp=2, stage 0: 4 (parameters) + 4 (gradients) + 8 (moments) bytes a parameter; one
  // micro-batch of 1 sequence: sbh (10 + 24) x 2 bytes (f32: twice the 16-bit 34 sbh / 2) in the
  // layer, or the head's 4 b s V f32 logits beside the layer on the last stage, whichever is larger.
  const double sbh = 4 * 8;
  const double layer = sbh * 34 * 4 / 2, head = 4 * 4 * 16;
  EXPECT_EQ(analytic_memory(toy(), one(2, 1, 1, 1), 2, "f32"), static_cast<int64_t>(16 * params + layer + head));
  // Stage 3 shards everything over the 2 data ranks and keeps 2 gathered layers.
  Candidate z3 = one(2, 1, 1, 1);
  z3.sharding_stage = 3;
  const double layer_params = 8 * 24 + 64 + 2 * 8 * 32 + 2 * 8;
  EXPECT_EQ(analytic_memory(toy(), z3, 2, "f32"), static_cast<int64_t>(16 * params / 2 + layer + head + 2 * 4 * layer_params));
}

}  // namespace
}  // namespace shardwise::plan
