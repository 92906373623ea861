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
  // A layer's forward on b=2: 2bs (h (3 x 8) + 8 x 8) (attention) + 4 b s^2 (8) / 2 (the fused core's
  // causal half of the scores and probs x V) + 2bs (2 x 8 x 32) (MLP); the head 2bs h V; backward
  // twice; 3 micro-batches.
  const double b = 2, s = 4;
  const double layer = 2 * b * s * (8 * 24 + 64) + 4 * b * s * s * 8 / 2 + 2 * b * s * (2 * 8 * 32);
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
  // The unfused core computes the whole [s, s] scores (Narayanan et al.'s 1 + s / 6h term).
  ModelSize unfused = toy();
  unfused.fused_attention = false;
  EXPECT_DOUBLE_EQ(analytic_estimate(cluster(1e9, 1e300), unfused, one(1, 1, 2, 3), 6, "f32").flops,
                   3 * 3 * (forward + 4 * b * s * s * 8 / 2));
}

TEST(Analytic, MemoryBoundKernelsMoveTheLayersActivationsTwice) {
  // f32, b=2: a layer's activations sbh (10 + (8 + 4 x 32 / 8)) x 4 / 2 bytes, sbh = 4 x 2 x 8;
  // written and read once in the forward (2x), twice that in the backward: 6x a micro-batch, 3 of them.
  const double sbh = 4 * 2 * 8, act = sbh * 34 * 2;
  const StepEstimate e = analytic_estimate(cluster(1e300, 1e300, 1e9), toy(), one(1, 1, 2, 3), 6, "f32");
  EXPECT_NEAR(e.parts.at("memory_bound"), 3 * 6 * act / 1e9, 1e-15);
  // The unfused core adds its scores, mask and probabilities: 5 a s^2 b / t at 2 bytes (here 4).
  ModelSize unfused = toy();
  unfused.fused_attention = false;
  const double scores = 5 * 2 * 4 * 4 * 2 * 2;
  EXPECT_NEAR(analytic_estimate(cluster(1e300, 1e300, 1e9), unfused, one(1, 1, 2, 3), 6, "f32").parts.at("memory_bound"),
              3 * 6 * (act + scores) / 1e9, 1e-15);
  // Full recompute moves the forward's bytes once more.
  Candidate rc = one(1, 1, 2, 3);
  rc.recompute = "full";
  EXPECT_NEAR(analytic_estimate(cluster(1e300, 1e300, 1e9), toy(), rc, 6, "f32").parts.at("memory_bound"),
              3 * 8 * act / 1e9, 1e-15);
}

TEST(Analytic, CpSplitsTheTokensAndPassesKeysAndValuesAroundItsRing) {
  // cp=2 (ranks 0, 1 on one node), b=1, seq 4: each rank 2 tokens; its share of the causal scores
  // is half of the whole 4 b s^2 (8) / 2 (cp's balanced order).
  Candidate c = one(1, 1, 1, 2);
  c.cp = 2;
  const double tokens = 2;
  const double layer = 2 * tokens * (8 * 24 + 64 + 2 * 8 * 32) + 4 * 1 * 4 * 4 * 8 / 2 / 2;
  const double forward = layer + 2 * tokens * 8 * 16;
  const ClusterSpec flops = cluster(1e9, 1e300);
  EXPECT_DOUBLE_EQ(analytic_estimate(flops, toy(), c, 2, "f32").flops, 2 * 3 * forward);
  // The keys and values of the sequence, b s 2 kv d f32 bytes, an all-gather's bytes over cp once in
  // the forward and twice in the backward; the gradients are all-reduced over dp x cp = 2 ranks.
  const ClusterSpec links = cluster(1e300, 1e9);
  const StepEstimate e = analytic_estimate(links, toy(), c, 2, "f32");
  const double kv = 1 * 4 * 2 * 2 * 4 * 4.0;
  EXPECT_NEAR(e.parts.at("cp_exchange"), 2 * 3 * collective_seconds(CollectiveKind::AllGather, kv, 2, links.intra_node),
              1e-15);
  const double params = 8 * 24 + 64 + 2 * 8 * 32 + 2 * 8 + 16 * 8;
  EXPECT_NEAR(e.parts.at("grad_sync"), collective_seconds(CollectiveKind::AllReduce, 4 * params, 2, links.intra_node),
              1e-15);
  // Activations: a cp rank holds its 2 of the 4 tokens.
  const double sbh = 2 * 8, head = 4 * 2 * 16;
  EXPECT_EQ(analytic_memory(toy(), c, 2, "f32"), static_cast<int64_t>(16 * params + sbh * 34 * 2 + head));
}

TEST(Analytic, SwiGluAndGroupedQueryAttentionCountTheirOwnSizes) {
  // Llama-like: 2 heads of 4 sharing 1 key/value head, a SwiGLU MLP of 24. Attention parameters
  // 8 x 4 x (2 + 2) + 2 x 4 x 8 = 192, the MLP 3 x 8 x 24 = 576; a layer's activations
  // sbh (10 + 8 + 8 x 24 / 8) (SwiGLU's gate, up, activation and product); cp=2 passes the one
  // key/value head's b s 2 x 4 f32 bytes.
  ModelSize m = toy();
  m.kv_heads = 1, m.mlp_width = 24, m.swiglu = true, m.tied = false;
  EXPECT_EQ(m.params(), 192 + 576 + 2 * 8 + 2 * 16 * 8);
  Candidate c = one(1, 1, 1, 1);
  c.cp = 2;
  const ClusterSpec cl = cluster(1e300, 1e9, 1e9);
  const StepEstimate e = analytic_estimate(cl, m, c, 1, "f32");
  const double sbh = 2 * 8, act = sbh * 42 * 2;
  EXPECT_NEAR(e.parts.at("memory_bound"), 6 * act / 1e9, 1e-15);
  EXPECT_NEAR(e.parts.at("cp_exchange"), 3 * collective_seconds(CollectiveKind::AllGather, 4 * 2 * 4 * 4.0, 2, cl.intra_node),
              1e-15);
  // The search's timer keeps a simulated step by its inputs and gives the same step again.
  AnalyticTimer timer;
  Candidate pp = one(1, 1, 1, 4);
  pp.pp = 2;
  const double first = analytic_estimate(cl, m, pp, 4, "f32", &timer).step;
  EXPECT_EQ(timer.steps.size(), 2u);  // with and without the pipeline's messages
  EXPECT_DOUBLE_EQ(analytic_estimate(cl, m, pp, 4, "f32", &timer).step, first);
  EXPECT_EQ(timer.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(analytic_estimate(cl, m, pp, 4, "f32").step, first);
}

// 2 devices a node; pp=2 x tp=2: the tp pair (0, 1) inside a node, the pp pair (0, 2) across nodes.
ClusterSpec two_a_node(double peak, double intra, double inter) {
  ClusterSpec c = cluster(peak, intra);
  c.devices_per_node = 2;
  c.inter_node = {inter, 0};
  return c;
}

TEST(Analytic, PipelineMessagesAreScatteredOverTpAndGathered) {
  // One micro-batch on 1F1B over 2 stages, compute free: stage 0's message, stage 1's gradient back.
  // Each is Narayanan et al. section 4.1's scatter/gather: 1/t of the b s h f32 activations over the
  // inter-node link, then an all-gather of them over the tp pair.
  ModelSize m = toy();
  m.layers = 2;
  Candidate c = one(1, 2, 1, 1);
  c.pp = 2;
  const ClusterSpec cl = two_a_node(1e300, 1e10, 1e9);
  const double act = 1 * 4 * 8 * 4.0;
  const double message = collective_seconds(CollectiveKind::SendRecv, act / 2, 2, cl.inter_node) +
                         collective_seconds(CollectiveKind::AllGather, act, 2, cl.intra_node);
  const StepEstimate e = analytic_estimate(cl, m, c, 1, "f32");
  EXPECT_NEAR(e.parts.at("pp_send"), 2 * message, 1e-15);
  // The tied embedding's gradient, summed by the first and the last stage once a step.
  EXPECT_NEAR(e.parts.at("grad_sync"), collective_seconds(CollectiveKind::AllReduce, 4 * 16 * 8 / 2, 2, cl.inter_node),
              1e-15);
  // With sequence parallelism the activations are already split: no all-gather.
  c.sequence_parallel = true;
  EXPECT_NEAR(analytic_estimate(cl, m, c, 1, "f32").parts.at("pp_send"),
              2 * collective_seconds(CollectiveKind::SendRecv, act / 2, 2, cl.inter_node), 1e-15);
}

TEST(Analytic, TheHeadRunsOnceAMicroBatchAndUnevenStagesTakeTheLargest) {
  // 3 layers on 2 stages: a rank holds 2 (the slowest's). 1F1B, 4 micro-batches of 1, links free:
  // (m + pp - 1) (f + b) for the layers and the last stage's head once a micro-batch, m x 3 x head.
  ModelSize m = toy();
  m.layers = 3;
  Candidate c = one(1, 1, 1, 4);
  c.pp = 2;
  const double layer = 2 * 4 * (8 * 24 + 64 + 2 * 8 * 32) + 4 * 4 * 4 * 8 / 2, head = 2 * 4 * 8 * 16;
  const double f = 2 * layer / 1e9;
  const StepEstimate e = analytic_estimate(two_a_node(1e9, 1e300, 1e300), m, c, 4, "f32");
  EXPECT_NEAR(e.step, 5 * 3 * f + 4 * 3 * head / 1e9, 1e-12);
  EXPECT_NEAR(e.parts.at("bubble"), 1 * 3 * f, 1e-12);
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

// bf16 stores the parameters in 16 bits, but shardwise's kernels compute and keep activations in f32
// (the compiled programs' memory plan, BENCHMARKS.md): the activations are the f32 run's, and
// without recompute each micro-batch also keeps the f32 copy of its layer's weights.
TEST(Analytic, Bf16KeepsF32ActivationsAndWithoutRecomputeTheWeightsF32Copies) {
  const double params = 8 * 24 + 64 + 2 * 8 * 32 + 2 * 8 + 16 * 8;
  const double layer_params = 8 * 24 + 64 + 2 * 8 * 32 + 2 * 8;
  const double sbh = 4 * 8, layer = sbh * 34 * 4 / 2, head = 4 * 4 * 16;
  // 2 (parameters) + 4 (f32 gradients) + 8 (moments) + 4 (f32 masters) bytes a parameter.
  const double state = 18 * params;
  EXPECT_EQ(analytic_memory(toy(), one(2, 1, 1, 1), 2, "bf16"),
            static_cast<int64_t>(state + layer + 4 * layer_params + head));
  // Full recompute: the layer's f32 input (sbh x 4 bytes) kept, one layer's activations while it
  // is recomputed (its weights cast inside the recomputed layer).
  Candidate full = one(2, 1, 1, 1);
  full.recompute = "full";
  EXPECT_EQ(analytic_memory(toy(), full, 2, "bf16"), static_cast<int64_t>(state + sbh * 4 + layer + head));
}

// Interleaved on pp=2 x 2 virtual stages (4 layers: 2 a rank): the first rank holds p (1 + (p - 1) /
// p v) = 2.5 stages' micro-batches in flight with 4 micro-batches, but with 2 no more than both (the
// warm-up's 4 chunks are every chunk of the step), as the schedule's action list holds them.
TEST(Analytic, InterleavedHoldsAtMostEveryMicroBatchInFlight) {
  ModelSize m = toy();
  m.layers = 4;
  auto memory = [&](int64_t accumulation) {
    Candidate c = one(1, 1, 1, accumulation);
    c.pp = 2, c.schedule = "interleaved", c.virtual_stages = 2;
    return analytic_memory(m, c, accumulation, "f32");
  };
  const double layer = 4 * 8 * 34 * 4 / 2;  // sbh (10 + 24) x 2 bytes a layer, f32
  EXPECT_EQ(memory(4) - memory(2), static_cast<int64_t>((2.5 - 2) * 2 * layer));
}

// Sequence parallelism on tp=2: K eq. 5's activations, all of them split over tp (sbh 34 / 2 at 2
// bytes), and the two all-gathered matmul inputs the runtime keeps whole (2 sbh x 1/2 more than
// their shards), at 4 bytes; the head's logits over tp.
TEST(Analytic, SequenceParallelKeepsTheGatheredMatmulInputsWhole) {
  Candidate c = one(1, 2, 1, 1);
  c.sequence_parallel = true;
  const double params = (8 * 24 + 64 + 2 * 8 * 32) / 2.0 + 2 * 8 + 16 * 8 / 2.0;
  const double sbh = 4 * 8, layer = sbh * 34 / 2 * 4 / 2 + 2 * sbh * (1 - 0.5) * 4, head = 4 * 4 * 16 / 2;
  EXPECT_EQ(analytic_memory(toy(), c, 1, "f32"), static_cast<int64_t>(16 * params + layer + head));
}

}  // namespace
}  // namespace shardwise::plan
