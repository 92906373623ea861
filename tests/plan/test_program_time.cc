// The step-time model over lowered programs, on toy programs whose time is known by hand.
#include <gtest/gtest.h>

#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"
#include "shardwise/plan/program_time.h"

using namespace shardwise;
using namespace shardwise::plan;

namespace {
ClusterSpec toy(int64_t nodes, int64_t per_node) {
  ClusterSpec c;
  c.name = "toy";
  c.nodes = nodes, c.devices_per_node = per_node;
  c.peak_flops = {{"f32", 1e9}, {"tf32", 1e9}, {"bf16", 1e9}};
  c.memory_bandwidth = 1e15;  // memory never binds here
  c.intra_node = {1e9, 1e-6};
  c.inter_node = {1e8, 1e-5};
  return c;
}
// y = x w, x [64, 32] by w [32, 16], built into `g` and lowered on one rank.
graph::Program one_gemm(graph::Graph& g) {
  auto x = g.input("x", Shape{64, 32});
  auto w = g.param("w", Shape{32, 16});
  g.matmul(x, w, false, "y");
  return graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{1})));
}

// y = x w with x [8, 64] S(1) and w [64, 4] S(0) over 4 ranks, y annotated R: one all-reduce.
graph::Program row_sharded_gemm(graph::Graph& g) {
  auto x = g.input("x", Shape{8, 64});
  auto w = g.param("w", Shape{64, 4});
  g.annotate(x, "S(1)");
  g.annotate(w, "S(0)");
  g.annotate(g.matmul(x, w, false, "y"), "R");
  return graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{4})));
}
}  // namespace

TEST(ProgramTime, OneGemmOfKnownFlopsAtAKnownRate) {
  graph::Graph g;
  graph::Program p = one_gemm(g);
  ProgramTime t = program_time(g, p, 0, toy(1, 1), "f32");
  EXPECT_DOUBLE_EQ(t.flops, 2.0 * 64 * 32 * 16);
  EXPECT_DOUBLE_EQ(t.compute_s, 2.0 * 64 * 32 * 16 / 1e9);
  EXPECT_DOUBLE_EQ(t.collectives(), 0);
}

TEST(ProgramTime, ARowShardedGemmAllReducesItsPartialResultOnTheGroupsLink) {
  // y = x w with x [8, 64] sharded on its columns and w [64, 4] on its rows over 4 ranks: each
  // rank multiplies 8 x 16 by 16 x 4 and y (8 x 4 f32 = 128 bytes) comes out Partial; annotated R,
  // one all-reduce over the 4 ranks: 2 (4-1) latencies + 2 (4-1)/4 x 128 bytes over the link.
  graph::Graph g;
  graph::Program p = row_sharded_gemm(g);
  const double bytes = 2.0 * 3 / 4 * 128;
  ProgramTime one_node = program_time(g, p, 0, toy(1, 4), "f32");
  EXPECT_DOUBLE_EQ(one_node.flops, 2.0 * 8 * 16 * 4);
  ASSERT_EQ(one_node.collective_s.count("all_reduce"), 1u) << p.to_string(g);
  EXPECT_NEAR(one_node.collective_s["all_reduce"], 6 * 1e-6 + bytes / 1e9, 1e-15);
  // The same 4 ranks on two nodes of two: the ring crosses nodes, the inter-node link bounds it.
  ProgramTime two_nodes = program_time(g, p, 0, toy(2, 2), "f32");
  EXPECT_NEAR(two_nodes.collective_s["all_reduce"], 6 * 1e-5 + bytes / 1e8, 1e-15);
}

TEST(ProgramTime, FlashAttentionAndTheFusedHeadCountTheirGemmFlops) {
  // Causal attention over q, k, v [2, 4, 16, 8]: the forward 2 S^2 D a head (the tiles on and below
  // the diagonal of q k^T and p v), the backward 2.5 times that.
  graph::Graph g;
  auto q = g.param("q", Shape{2, 4, 16, 8});
  auto k = g.param("k", Shape{2, 4, 16, 8});
  auto v = g.param("v", Shape{2, 4, 16, 8});
  auto out = g.op("flash_attention", {q, k, v}, Attrs{{"scale", 0.25}}, "attn")[0];
  // The fused head over x [32, 8] and w [64, 8]: logits 2 N h V; with both gradients in the forward
  // (forward_grads 3) three GEMMs there and none in the backward.
  auto x = g.reshape(g.transpose(out, {0, 2, 1, 3}), {32, 32}, "x");
  auto w = g.param("w", Shape{64, 32});
  auto labels = g.input("labels", Shape{32}, DType::I64);
  Attrs head{{"reduction", std::string("sum")}};
  head.set("forward_grads", int64_t{3}), head.set("grad_scale", 1.0);
  auto loss = g.op1("lm_head_cross_entropy", {x, w, labels}, std::move(head), "loss");
  graph::append_backward(g, loss);
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{1})));
  const double attention = 2.0 * (2 * 4) * 16 * 16 * 8, gemm = 2.0 * 32 * 32 * 64;
  std::map<std::string, double> flops;
  const std::vector<int64_t> coords = {0};
  for (const graph::Instr& ins : p.instrs) {
    if (ins.kind != graph::InstrKind::Kernel && ins.kind != graph::InstrKind::Backward) continue;
    flops[g.node(ins.node).op + (ins.kind == graph::InstrKind::Backward ? "_grad" : "")] += instr_flops(g, p, ins, coords);
  }
  EXPECT_DOUBLE_EQ(flops["flash_attention"], attention);
  EXPECT_DOUBLE_EQ(flops["flash_attention_grad"], 2.5 * attention);
  EXPECT_DOUBLE_EQ(flops["lm_head_cross_entropy"], 3 * gemm);
  EXPECT_DOUBLE_EQ(flops["lm_head_cross_entropy_grad"], 0);
  EXPECT_DOUBLE_EQ(program_time(g, p, 0, toy(1, 1), "f32").flops, 3.5 * attention + 3 * gemm);
}

TEST(ProgramTime, ReshapesAreViewsAndCostNothing) {
  // y = reshape(x w): the GEMM's time alone (memory never binds here; a reshape would be charged its
  // bytes at the memory bandwidth of 1e6 B/s below if it were counted).
  graph::Graph g;
  auto x = g.input("x", Shape{64, 32});
  auto w = g.param("w", Shape{32, 16});
  g.reshape(g.matmul(x, w, false, "y"), {16, 64}, "z");
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{1})));
  ClusterSpec slow_memory = toy(1, 1);
  slow_memory.memory_bandwidth = 1e6;
  ProgramTime t = program_time(g, p, 0, slow_memory, "f32");
  const double gemm_bytes = 4.0 * (64 * 32 + 32 * 16 + 64 * 16);
  EXPECT_DOUBLE_EQ(t.compute_s, std::max(2.0 * 64 * 32 * 16 / 1e9, gemm_bytes / 1e6));
  EXPECT_EQ(t.by_op.count("reshape"), 0u);
}

TEST(ProgramTime, ACalibrationsKernelFitTimesItsTypeAndCountsIt) {
  // One GEMM of 2 x 64 x 32 x 16 FLOPs at 1e9 FLOP/s, fitted as 1 ms + 2 x that.
  graph::Graph g;
  graph::Program p = one_gemm(g);
  ClusterSpec c = toy(1, 1);
  c.kernel_fits["matmul"] = {1e-3, 2};
  ProgramTime t = program_time(g, p, 0, c, "f32");
  EXPECT_DOUBLE_EQ(t.compute_s, 1e-3 + 2 * 2.0 * 64 * 32 * 16 / 1e9);
  EXPECT_EQ(t.count_by_op["matmul"], 1);
  EXPECT_DOUBLE_EQ(t.flops, 2.0 * 64 * 32 * 16);  // the FLOPs are the op's, whatever the fit
}

TEST(ProgramTime, AReshardFitTimesTheCollectiveInstruction) {
  // The all-reduce of the row-sharded GEMM above (128 bytes over 4 ranks of one node) fitted as 0.1 ms + 3 x it.
  graph::Graph g;
  graph::Program p = row_sharded_gemm(g);
  ClusterSpec c = toy(1, 4);
  c.kernel_fits["reshard"] = {1e-4, 3};
  ProgramTime t = program_time(g, p, 0, c, "f32");
  EXPECT_NEAR(t.collective_s["all_reduce"], 1e-4 + 3 * (6 * 1e-6 + 2.0 * 3 / 4 * 128 / 1e9), 1e-15);
  EXPECT_EQ(t.count_by_op["reshard"], 1);
}

// A calibration's busy scale (plan/cluster.h) slows its type's kernels only where the program's
// ranks are at least the cores; reshards are not kernels and keep their time.
TEST(ProgramTime, EveryCoreHoldingARankSlowsEachTypeByItsBusyScale) {
  graph::Graph g;
  graph::Program p = row_sharded_gemm(g);
  ClusterSpec c = toy(1, 4);
  const ProgramTime base = program_time(g, p, 0, c, "f32");
  ASSERT_GT(base.by_op.at("matmul"), 0);
  c.busy_kernel_scales["matmul"] = 1.5;
  c.cores = 8;  // 4 ranks on 8 cores: some idle
  EXPECT_DOUBLE_EQ(program_time(g, p, 0, c, "f32").by_op.at("matmul"), base.by_op.at("matmul"));
  c.cores = 4;
  const ProgramTime busy = program_time(g, p, 0, c, "f32");
  EXPECT_DOUBLE_EQ(busy.by_op.at("matmul"), 1.5 * base.by_op.at("matmul"));
  EXPECT_DOUBLE_EQ(busy.compute_s, base.compute_s + 0.5 * base.by_op.at("matmul"));
  EXPECT_DOUBLE_EQ(busy.collective_s.at("all_reduce"), base.collective_s.at("all_reduce"));
}

TEST(ProgramTime, TheMoeMlpCountsItsExpertsGemmFlops) {
  // 24 tokens of hidden 8, 4 experts of width 16, top 2: each token through 2 experts' three GEMMs
  // (2 x 8 x 16 each), plus the router's 2 x 24 x 4 x 8; the backward twice that.
  graph::Graph g;
  auto x = g.param("x", Shape{24, 8});
  auto gate = g.param("gate", Shape{4, 8});
  auto w1 = g.param("w1", Shape{4, 16, 8});
  auto w3 = g.param("w3", Shape{4, 16, 8});
  auto w2 = g.param("w2", Shape{4, 8, 16});
  g.op("moe_mlp", {x, gate, w1, w3, w2}, Attrs{{"top_k", int64_t{2}}}, "moe");
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{1})));
  const double forward = 24 * 2 * 3 * 2.0 * 8 * 16 + 2.0 * 24 * 4 * 8;
  const std::vector<int64_t> coords = {0};
  double flops = 0;
  for (const graph::Instr& ins : p.instrs)
    if (ins.kind == graph::InstrKind::Kernel && g.node(ins.node).op == "moe_mlp") flops += instr_flops(g, p, ins, coords);
  EXPECT_DOUBLE_EQ(flops, forward);
}

TEST(ProgramTime, TheVocabParallelHeadsOwnAllReducesAreTimedOnItsGroupsLink) {
  // The vocab-parallel head over x [32, 32] and w [64, 32] sharded on its vocabulary over 2 ranks (32
  // classes a rank), chunks of 20 rows (chunk_bytes 20 rows x 32 classes x 4 bytes): rows 0-19 and
  // 20-31. The forward all-reduces each chunk's row max (8 bytes a row) and its sums with the target
  // logits (16); the backward (the forward formed dh only, so it recomputes the logits for dW) the
  // max and the sums again (8 + 8). On 2 ranks a ring all-reduce of B bytes is 2 latencies + B /
  // bandwidth.
  graph::Graph g;
  auto x = g.param("x", Shape{32, 32});
  auto w = g.param("w", Shape{64, 32});
  g.annotate(w, "S(0)");
  auto labels = g.input("labels", Shape{32}, DType::I64);
  Attrs head{{"reduction", std::string("sum")}};
  head.set("forward_grads", int64_t{1}), head.set("grad_scale", 1.0), head.set("chunk_bytes", int64_t{20 * 32 * 4});
  auto loss = g.op1("vocab_parallel_lm_head_cross_entropy", {x, w, labels}, std::move(head), "loss");
  graph::append_backward(g, loss);
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{2})));
  const std::vector<int64_t> coords = {0};
  std::map<std::string, std::vector<double>> bytes;
  for (const graph::Instr& ins : p.instrs) {
    if (ins.kind != graph::InstrKind::Kernel && ins.kind != graph::InstrKind::Backward) continue;
    HeadCollectives h = head_collectives(g, p, ins, coords);
    if (h.bytes.empty()) continue;
    EXPECT_EQ(h.mesh_dims, std::vector<int>{0});
    bytes[ins.kind == graph::InstrKind::Backward ? "backward" : "forward"] = h.bytes;
  }
  EXPECT_EQ(bytes["forward"], (std::vector<double>{160, 320, 96, 192})) << p.to_string(g);
  EXPECT_EQ(bytes["backward"], (std::vector<double>{160, 160, 96, 96})) << p.to_string(g);
  // Each instruction's time is its GEMMs' (the forward 2 of 2 N h V_local: logits and dh; the
  // backward 2: logits again and dW) and its all-reduces.
  const ProgramTime t = program_time(g, p, 0, toy(1, 2), "f32");
  const double gemm = 2.0 * 32 * 32 * 32 / 1e9;
  EXPECT_NEAR(t.by_op.at("vocab_parallel_lm_head_cross_entropy"), 2 * gemm + 4 * 2e-6 + 768 / 1e9, 1e-15);
  EXPECT_NEAR(t.by_op.at("vocab_parallel_lm_head_cross_entropy_grad"), 2 * gemm + 4 * 2e-6 + 512 / 1e9, 1e-15);
  EXPECT_GE(t.collective_s.at("all_reduce"), 8 * 2e-6 + 1280 / 1e9 - 1e-15);
  // Both gradients formed in the forward: the backward has no GEMM and no all-reduce.
  graph::Graph g2;
  auto x2 = g2.param("x", Shape{32, 32});
  auto w2 = g2.param("w", Shape{64, 32});
  g2.annotate(w2, "S(0)");
  Attrs both{{"reduction", std::string("sum")}};
  both.set("forward_grads", int64_t{3}), both.set("grad_scale", 1.0);
  graph::append_backward(g2, g2.op1("vocab_parallel_lm_head_cross_entropy", {x2, w2, g2.input("labels", Shape{32}, DType::I64)},
                                    std::move(both), "loss"));
  graph::Program p2 = graph::lower(g2, graph::complete(g2, mesh::ProcessMesh(Shape{2})));
  for (const graph::Instr& ins : p2.instrs) {
    if (ins.kind == graph::InstrKind::Backward) {
      EXPECT_TRUE(head_collectives(g2, p2, ins, coords).bytes.empty());
    }
  }
}

TEST(ProgramTime, AReshardOnACalibratedMachineTakesItsMeasuredCollectiveByBuffer) {
  // The all-reduce of the row-sharded GEMM (y: 8 x 4 f32 = 128 bytes a rank over 4 ranks; the
  // reshard planner counts the busiest rank's 2 (4-1)/4 x 128 = 192 bytes sent) on a machine that
  // measured all_reduce over 4 ranks at 64 and 256 bytes: 1 us + 2 us x (128 - 64) / (256 - 64).
  graph::Graph g;
  graph::Program p = row_sharded_gemm(g);
  ClusterSpec c = toy(1, 4);
  c.measured_collectives["all_reduce"] = {4, {{64, 1e-6}, {256, 3e-6}}};
  EXPECT_NEAR(program_time(g, p, 0, c, "f32").collective_s["all_reduce"], 1e-6 + 2e-6 * 64 / 192, 1e-15);
}
