// The step-time model's pieces on toy cases whose time is known by hand.
#include <gtest/gtest.h>

#include "shardwise/core/error.h"
#include "shardwise/plan/cost.h"

using namespace shardwise;
using namespace shardwise::plan;

namespace {
ClusterSpec toy() {  // 2 nodes of 4 devices
  ClusterSpec c;
  c.name = "toy";
  c.nodes = 2, c.devices_per_node = 4;
  c.peak_flops = {{"f32", 1e12}, {"tf32", 2e12}, {"bf16", 4e12}};
  c.memory_bandwidth = 1e11;
  c.intra_node = {1e10, 1e-6};
  c.inter_node = {1e9, 1e-5};
  return c;
}
}  // namespace

TEST(Cost, OneGemmAtAKnownRate) {
  ClusterSpec c = toy();
  const double flops = 2.0 * 1024 * 1024 * 1024;  // 1024^3 GEMM
  EXPECT_DOUBLE_EQ(compute_seconds(c, flops, "bf16"), flops / 4e12);
  c.efficiency["compute"] = 0.5;
  EXPECT_DOUBLE_EQ(compute_seconds(c, flops, "bf16"), flops / 2e12);
  EXPECT_DOUBLE_EQ(memory_seconds(c, 1e9), 1e-2);
}

TEST(Cost, AllReduceOnARing) {
  // 4 ranks, 1 MB: 2*3 latency steps + 2*3/4 of the bytes over the link.
  LinkSpec link{1e10, 1e-6};
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::AllReduce, 1e6, 4, link), 6e-6 + 1.5e6 / 1e10);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::AllGather, 1e6, 4, link), 3e-6 + 0.75e6 / 1e10);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::ReduceScatter, 1e6, 4, link), 3e-6 + 0.75e6 / 1e10);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::SendRecv, 1e6, 2, link), 1e-6 + 1e6 / 1e10);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::AllReduce, 1e6, 1, link), 0);
}

TEST(Cost, GroupLinkByPlacement) {
  ClusterSpec c = toy();
  std::vector<int> same_node{4, 5, 6, 7}, across{2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(group_link(c, same_node).bandwidth, 1e10);
  EXPECT_DOUBLE_EQ(group_link(c, across).bandwidth, 1e9);
  EXPECT_DOUBLE_EQ(group_link(c, across).latency, 1e-5);
  c.efficiency["network"] = 0.8;
  EXPECT_DOUBLE_EQ(group_link(c, same_node).bandwidth, 0.8e10);
  std::vector<int> outside{7, 8};
  EXPECT_THROW(group_link(c, outside), Error);
}

TEST(Cost, AlphaBetaFitReproducesItsPointsAndInvertsTheRing) {
  LinkSpec truth{2e9, 4e-6};
  const double n1 = 1 << 12, n2 = 1 << 22;
  for (auto kind : {CollectiveKind::AllReduce, CollectiveKind::AllGather, CollectiveKind::AllToAll}) {
    const double t1 = collective_seconds(kind, n1, 4, truth), t2 = collective_seconds(kind, n2, 4, truth);
    AlphaBeta f = fit_alpha_beta(kind, 4, n1, t1, n2, t2);
    EXPECT_NEAR(f.predict(n1), t1, 1e-15);
    EXPECT_NEAR(f.predict(n2), t2, 1e-15);
    EXPECT_NEAR(f.link.bandwidth, truth.bandwidth, 1e-3 * truth.bandwidth) << collective_name(kind);
    EXPECT_NEAR(f.link.latency, truth.latency, 1e-9) << collective_name(kind);
    EXPECT_TRUE(f.note.empty());
  }
}

TEST(Cost, AlphaBetaFitClampsAndSays) {
  AlphaBeta f = fit_alpha_beta(CollectiveKind::AllReduce, 2, 100, 2e-6, 1e6, 1e-6);  // larger was faster
  EXPECT_TRUE(std::isinf(f.link.bandwidth));
  EXPECT_NE(f.note.find("not slower"), std::string::npos);
  EXPECT_THROW(fit_alpha_beta(CollectiveKind::AllReduce, 2, 100, 1, 100, 2), Error);
  EXPECT_THROW(fit_alpha_beta(CollectiveKind::AllReduce, 1, 100, 1, 200, 2), Error);
}

TEST(Cost, TwoStageGpipeHasTheKnownBubble) {
  // GPipe over p = 2 stages and m = 4 micro-batches, forward 1 s, backward 2 s, free sends:
  // (m + p - 1) (f + b) = 5 * 3 = 15 s, of which each rank computes m (f + b) = 12 s: bubble 3/15.
  PipelineTime t = pipeline_time("fthenb", 2, 4, 1, 1.0, 2.0, 0.0);
  EXPECT_DOUBLE_EQ(t.step, 15.0);
  EXPECT_DOUBLE_EQ(t.bubble_fraction, 0.2);
  // Sends of 0.5 s, on the sender's timeline: stage 0 runs F0 S F1 S F2 S F3 S (F3's message
  // arrives at 6), stage 1 F0..F3 at 1.5, 3, 4.5, 6 (ends 7), then B0 S B1 S B2 S B3 S (B3's gradient
  // arrives at 17); stage 0's B0..B3 start at 9.5, 12, 14.5, 17: the step ends at 19.
  EXPECT_DOUBLE_EQ(pipeline_time("fthenb", 2, 4, 1, 1.0, 2.0, 0.5).step, 19.0);
  // One stage: no bubble.
  EXPECT_DOUBLE_EQ(pipeline_time("1f1b", 1, 4, 1, 1.0, 2.0, 0.0).step, 12.0);
}

TEST(Cost, AGemmRunsAtTheNearestMeasuredShapesRate) {
  ClusterSpec c = toy();
  EXPECT_DOUBLE_EQ(gemm_seconds(c, 1e9, "f32", 512, 512, 512), 1e9 / 1e12);  // nothing measured: the peak
  c.gemm_rates = {{"f32", 512, 3072, 768, 4e10}, {"f32", 512, 512, 64, 1e11}, {"bf16", 512, 3072, 768, 5e9}};
  // 512 x 2048 x 1024 is nearest the first shape (log gaps 0.41 + 0.29), 256 x 512 x 32 the second (0.69 + 0.69).
  EXPECT_DOUBLE_EQ(gemm_seconds(c, 1e9, "f32", 512, 2048, 1024), 1e9 / 4e10);
  EXPECT_DOUBLE_EQ(gemm_seconds(c, 1e9, "f32", 256, 512, 32), 1e9 / 1e11);
  EXPECT_DOUBLE_EQ(gemm_seconds(c, 1e9, "tf32", 256, 512, 32), 1e9 / 1e11);  // tf32: f32's measurements
  EXPECT_DOUBLE_EQ(gemm_seconds(c, 1e9, "bf16", 64, 64, 64), 1e9 / 5e9);     // the only bf16 shape
  c.efficiency["compute"] = 0.5;
  EXPECT_DOUBLE_EQ(gemm_seconds(c, 1e9, "bf16", 64, 64, 64), 1e9 / 2.5e9);
}

TEST(Cost, AKernelFitRecoversTheLineItsSamplesLieOn) {
  // Three reference runs of a type timed by measured = count x 2 us + 3 x modelled.
  auto sample = [](double n, double m) { return KernelSample{n, m, n * 2e-6 + 3 * m}; };
  const std::vector<KernelSample> s = {sample(10, 1e-3), sample(4, 5e-3), sample(7, 2e-4)};
  const KernelFit f = fit_kernel(s);
  EXPECT_NEAR(f.overhead_s, 2e-6, 1e-12);
  EXPECT_NEAR(f.scale, 3, 1e-9);
}

TEST(Cost, AKernelFitClampsANegativeTermAndRefitsTheOther) {
  // measured = 2 x modelled - 1 us an instruction: the free fit's overhead is negative, so the
  // overhead is 0 and the scale the least-squares one alone, sum(m t) / sum(m m).
  const std::vector<KernelSample> s = {{1, 1e-3, 2e-3 - 1e-6}, {1, 4e-3, 8e-3 - 1e-6}};
  const KernelFit f = fit_kernel(s);
  EXPECT_EQ(f.overhead_s, 0);
  EXPECT_NEAR(f.scale, (1e-3 * (2e-3 - 1e-6) + 4e-3 * (8e-3 - 1e-6)) / (1e-6 + 16e-6), 1e-12);
  // A type the model gives no time (a view): the overhead alone, the mean a count.
  const std::vector<KernelSample> views = {{2, 0, 4e-6}, {4, 0, 8e-6}};
  EXPECT_NEAR(fit_kernel(views).overhead_s, 2e-6, 1e-15);
  EXPECT_EQ(fit_kernel(views).scale, 0);
  try {
    fit_kernel(std::vector<KernelSample>{{0, 0, 1e-3}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fit_kernel: no sample with an instruction that ran"), std::string::npos);
  }
}

TEST(Cost, AFittedTypeTakesItsOverheadAndScaleOthersTheirModelledTime) {
  ClusterSpec c = toy();
  c.kernel_fits["layer_norm"] = {5e-6, 4};
  EXPECT_DOUBLE_EQ(fitted_seconds(c, "layer_norm", 1e-3), 5e-6 + 4e-3);
  EXPECT_DOUBLE_EQ(fitted_seconds(c, "gelu", 1e-3), 1e-3);
}

TEST(Cost, RanksBeyondTheCoresShareThem) {
  ClusterSpec c = toy();
  EXPECT_EQ(core_contention(c, 8), 1);  // a datasheet cluster: each device its own
  c.cores = 2;
  EXPECT_EQ(core_contention(c, 1), 1);
  EXPECT_EQ(core_contention(c, 2), 1);
  EXPECT_EQ(core_contention(c, 4), 2);
  EXPECT_EQ(core_contention(c, 3), 1.5);
}

TEST(Cost, AMeasuredRankFactorReplacesTheCoreFormula) {
  ClusterSpec c = toy();
  c.cores = 2;
  c.rank_factors = {{2, 1.7}};
  EXPECT_EQ(rank_factor(c, 2), 1.7);  // measured
  EXPECT_EQ(rank_factor(c, 4), 2);    // not measured: ranks / cores
  EXPECT_EQ(rank_factor(c, 1), 1);
  c.mesh_factors = {{"[pp=2]", 2.5}};
  EXPECT_EQ(mesh_factor(c, "[pp=2]", 2), 2.5);  // measured on that mesh
  EXPECT_EQ(mesh_factor(c, "[dp=2]", 2), 1.7);  // not: the factor of its size
}

// A calibration's measured all-reduce over 2 ranks (4 KB: 10 us, 512 KB: 60 us, 16 MB: 7000 us):
// a buffer between two sizes is timed on the line between them, beyond the ends on the nearest two
// points' line; a group of another size, one across nodes, or a kind not measured takes the ring
// formula on its link.
TEST(Cost, AMeasuredCollectiveIsTimedBetweenTheSizesAroundItsBuffer) {
  ClusterSpec c = toy();
  c.measured_collectives["all_reduce"] = {2, {{4096, 10e-6}, {524288, 60e-6}, {16777216, 7000e-6}}};
  const std::vector<int> pair = {0, 1}, across = {0, 4}, four = {0, 1, 2, 3};
  auto at = [&](double bytes, std::span<const int> group, CollectiveKind kind = CollectiveKind::AllReduce) {
    return group_collective_seconds(c, kind, bytes, group);
  };
  EXPECT_NEAR(at(262144, pair), 10e-6 + 50e-6 * (262144.0 - 4096) / (524288 - 4096), 1e-15);
  EXPECT_NEAR(at(1 << 20, pair), 60e-6 + 6940e-6 * ((1 << 20) - 524288.0) / (16777216 - 524288), 1e-15);
  EXPECT_NEAR(at(1 << 25, pair), 60e-6 + 6940e-6 * ((1 << 25) - 524288.0) / (16777216 - 524288), 1e-12);
  EXPECT_NEAR(at(2048, pair), std::max(0.0, 10e-6 - 50e-6 * 2048 / (524288 - 4096)), 1e-15);
  EXPECT_DOUBLE_EQ(at(262144, four), collective_seconds(CollectiveKind::AllReduce, 262144, 4, c.intra_node));
  EXPECT_DOUBLE_EQ(at(262144, across), collective_seconds(CollectiveKind::AllReduce, 262144, 2, c.inter_node));
  EXPECT_DOUBLE_EQ(at(262144, pair, CollectiveKind::AllGather),
                   collective_seconds(CollectiveKind::AllGather, 262144, 2, c.intra_node));
  EXPECT_DOUBLE_EQ(ring_share(CollectiveKind::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(ring_share(CollectiveKind::AllGather, 4), 0.75);
}
