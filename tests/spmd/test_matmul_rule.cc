// Rule "matmul": explicit expected distributions for forward, reverse and grad.
#include <gtest/gtest.h>

#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

const Rule& rule() { return rules().get("matmul"); }

const ProcessMesh& mesh22() {
  static const ProcessMesh m(Shape{2, 2});
  return m;
}

TensorSpec spec(Shape shape, const char* dist, DType dtype = DType::F64) {
  return {shape, dtype, parse_dist(dist, 2)};
}

Attrs trans(bool tx, bool ty) {
  Attrs a;
  a.set("trans_x", tx);
  a.set("trans_y", ty);
  return a;
}

// Runs the forward rule on x, y and checks required x, y and the output.
void expect_forward(TensorSpec x, TensorSpec y, const char* want_x, const char* want_y, const char* want_out,
                    const Attrs& attrs = {}) {
  std::vector<TensorSpec> in = {x, y};
  SpmdResult r = rule().forward(mesh22(), in, attrs);
  ASSERT_EQ(r.inputs.size(), 2u);
  ASSERT_EQ(r.outputs.size(), 1u);
  std::string given = x.dist.to_string() + " | " + y.dist.to_string();
  EXPECT_EQ(r.inputs[0], parse_dist(want_x, 2)) << given << " -> x " << r.inputs[0].to_string();
  EXPECT_EQ(r.inputs[1], parse_dist(want_y, 2)) << given << " -> y " << r.inputs[1].to_string();
  EXPECT_EQ(r.outputs[0], parse_dist(want_out, 2)) << given << " -> out " << r.outputs[0].to_string();
}

TEST(MatmulRule, Registered) {
  EXPECT_EQ(rule().family, "matmul");
  EXPECT_FALSE(rule().summary.empty());
}

TEST(MatmulRule, ForwardShardsBatchMN) {
  // Row-sharded x, column-sharded y: the output keeps both.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,S(1)"), "S(0),R", "R,S(1)", "S(0),S(1)");
  // A replicated operand stays replicated.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,R"), "S(0),R", "R,R", "S(0),R");
  // m co-sharded over both mesh dims.
  expect_forward(spec({12, 6}, "S(0),S(0)"), spec({6, 12}, "R,R"), "S(0),S(0)", "R,R", "S(0),S(0)");
}

TEST(MatmulRule, ForwardContractedShardGivesPartialSum) {
  // x sharded along k on mesh dim 0: y must follow along k, the output is Partial(sum) there.
  expect_forward(spec({12, 6}, "S(1),R"), spec({6, 12}, "R,R"), "S(1),R", "S(0),R", "P(sum),R");
  // k on mesh 0 from y, n on mesh 1 from y.
  expect_forward(spec({12, 6}, "R,R"), spec({6, 12}, "S(0),S(1)"), "S(1),R", "S(0),S(1)", "P(sum),S(1)");
  // trans_x: x stored [k, m]; S(0) is k.
  expect_forward(spec({6, 12}, "S(0),S(1)"), spec({6, 12}, "R,R"), "S(0),S(1)", "S(0),R", "P(sum),S(0)",
                 trans(true, false));
  // trans_y: y stored [n, k]; S(1) is k, S(0) is n.
  expect_forward(spec({12, 6}, "R,R"), spec({12, 6}, "S(1),S(0)"), "S(1),R", "S(1),S(0)", "P(sum),S(1)",
                 trans(false, true));
}

TEST(MatmulRule, ForwardConflictsFirstTensorWins) {
  // Both claim mesh dim 0 (x for m, y for n): x wins, y is replicated there.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "S(1),R"), "S(0),R", "R,R", "S(0),R");
  // k sharded differently: x's mesh dim wins.
  expect_forward(spec({12, 6}, "S(1),R"), spec({6, 12}, "R,S(0)"), "S(1),R", "S(0),R", "P(sum),R");
}

TEST(MatmulRule, ForwardPartialInputs) {
  // x P(sum) with y R: linear in x, the output stays P(sum).
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "R,R"), "P(sum),R", "R,R", "P(sum),R");
  // y P(avg) where x is R: the output is P(avg) there.
  expect_forward(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,P(avg)"), "S(0),R", "R,P(avg)", "S(0),P(avg)");
  // ... but not where x shards m: sharding beats Partial.
  expect_forward(spec({12, 6}, "R,S(0)"), spec({6, 12}, "R,P(avg)"), "R,S(0)", "R,R", "R,S(0)");
  // x P(sum) and y P(avg) on different mesh dims: both pass through.
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "R,P(avg)"), "P(sum),R", "R,P(avg)", "P(sum),P(avg)");
  // Both Partial on the same mesh dim: x keeps it, y is reduced first.
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "P(sum),R"), "P(sum),R", "R,R", "P(sum),R");
  expect_forward(spec({12, 6}, "P(avg),R"), spec({6, 12}, "P(sum),R"), "P(avg),R", "R,R", "P(avg),R");
  // Max / min are not linear: resharded to Replicate; y's P(sum) then passes.
  expect_forward(spec({12, 6}, "P(max),R"), spec({6, 12}, "P(sum),P(min)"), "R,R", "P(sum),R", "P(sum),R");
  // Sharding beats Partial: y shards n on mesh 0, so x's P(sum) there is reduced first.
  expect_forward(spec({12, 6}, "P(sum),R"), spec({6, 12}, "S(1),R"), "R,R", "S(1),R", "S(1),R");
  // x shards k on mesh 0, y P(sum) there: y is reduced, then follows k.
  expect_forward(spec({12, 6}, "S(1),R"), spec({6, 12}, "P(sum),R"), "S(1),R", "S(0),R", "P(sum),R");
}

TEST(MatmulRule, ForwardBatchBroadcast) {
  // y has no batch dim: x's batch shard passes to the output.
  expect_forward(spec({2, 5, 3}, "S(0),S(1)"), spec({3, 4}, "R,R"), "S(0),S(1)", "R,R", "S(0),S(1)");
  // x's size-1 batch dim broadcasts: it cannot be sharded; y's batch shard wins.
  expect_forward(spec({1, 4, 3}, "S(0),R"), spec({2, 3, 5}, "S(0),S(2)"), "R,R", "S(0),S(2)", "S(0),S(2)");
  // Shared batch letter: y follows x.
  expect_forward(spec({2, 4, 3}, "S(0),R"), spec({2, 3, 5}, "R,R"), "S(0),R", "S(0),R", "S(0),R");
}

TEST(MatmulRule, ForwardVectors) {
  // 1-D x is [k]: sharding it shards k.
  expect_forward(spec({7}, "S(0),R"), spec({7, 3}, "R,S(1)"), "S(0),R", "S(0),S(1)", "P(sum),S(0)");
  // 1-D y is [k]; x's m passes to the 1-D output.
  expect_forward(spec({5, 7}, "S(0),R"), spec({7}, "R,S(0)"), "S(0),S(1)", "R,S(0)", "S(0),P(sum)");
  // Dot product: a Partial(sum) scalar.
  expect_forward(spec({12}, "S(0),R"), spec({12}, "R,R"), "S(0),R", "S(0),R", "P(sum),R");
}

TEST(MatmulRule, ForwardErrors) {
  std::vector<TensorSpec> bad = {spec({5, 7}, "R,R"), spec({6, 3}, "R,R")};
  try {
    rule().forward(mesh22(), bad, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("5x7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("6x3"), std::string::npos) << msg;
  }
  std::vector<TensorSpec> one = {spec({5, 7}, "R,R")};
  EXPECT_THROW(rule().forward(mesh22(), one, {}), Error);
  std::vector<TensorSpec> bad_dist = {spec({5, 7}, "R,R"), {Shape{7}, DType::F64, parse_dist("S(1),R", 2)}};
  EXPECT_THROW(rule().forward(mesh22(), bad_dist, {}), Error);
}

void expect_reverse(Shape xs, Shape ys, const char* out, const char* want_x, const char* want_y, const char* want_out,
                    const Attrs& attrs = {}) {
  std::vector<TensorSpec> in = {spec(xs, "R,R"), spec(ys, "R,R")};
  std::vector<TensorSpec> outs = {{Shape{}, DType::F64, parse_dist(out, 2)}};
  // The output shape: from the forward rule's viewpoint the verifier passes it; compute it here.
  std::vector<int64_t> dims;
  bool xv = xs.ndim() == 1, yv = ys.ndim() == 1;
  int nb = std::max(xv ? 0 : xs.ndim() - 2, yv ? 0 : ys.ndim() - 2);
  for (int i = 0; i < nb; ++i) {
    int xi = i - (nb - (xs.ndim() - 2)), yi = i - (nb - (ys.ndim() - 2));
    int64_t a = (!xv && xi >= 0) ? xs[xi] : 1, b = (!yv && yi >= 0) ? ys[yi] : 1;
    dims.push_back(a == 1 ? b : a);
  }
  if (!xv) dims.push_back(attrs.get_bool("trans_x", false) ? xs.back() : xs[xs.ndim() - 2]);
  if (!yv) dims.push_back(attrs.get_bool("trans_y", false) ? ys[ys.ndim() - 2] : ys.back());
  outs[0].shape = Shape(std::span<const int64_t>(dims));
  SpmdResult r = rule().reverse(mesh22(), in, outs, attrs);
  EXPECT_EQ(r.inputs[0], parse_dist(want_x, 2)) << out << " -> x " << r.inputs[0].to_string();
  EXPECT_EQ(r.inputs[1], parse_dist(want_y, 2)) << out << " -> y " << r.inputs[1].to_string();
  EXPECT_EQ(r.outputs[0], parse_dist(want_out, 2)) << out << " -> out " << r.outputs[0].to_string();
}

TEST(MatmulRule, Reverse) {
  expect_reverse({12, 6}, {6, 12}, "S(0),S(1)", "S(0),R", "R,S(1)", "S(0),S(1)");
  // Partial(sum) wanted: k sharded on that mesh dim.
  expect_reverse({12, 6}, {6, 12}, "P(sum),S(0)", "S(1),S(0)", "S(0),R", "P(sum),S(0)");
  expect_reverse({12, 6}, {6, 12}, "P(sum),P(sum)", "S(1),S(1)", "S(0),S(0)", "P(sum),P(sum)");
  // Partial(avg): x carries it, y replicated.
  expect_reverse({12, 6}, {6, 12}, "P(avg),S(1)", "P(avg),R", "R,S(1)", "P(avg),S(1)");
  // Partial(max) cannot be produced: Replicate.
  expect_reverse({12, 6}, {6, 12}, "P(max),S(0)", "R,S(0)", "R,R", "R,S(0)");
  // Transposed storage.
  expect_reverse({6, 12}, {12, 6}, "S(1),P(sum)", "R,S(0)", "S(0),S(1)", "S(1),P(sum)", trans(true, true));
  // Broadcast batch: x [1, 4, 3] cannot follow a batch shard.
  expect_reverse({1, 4, 3}, {2, 3, 5}, "S(0),S(1)", "R,S(1)", "S(0),R", "S(0),S(1)");
  // Vectors: the dot product's Partial(sum) comes from k.
  expect_reverse({12}, {12}, "P(sum),R", "S(0),R", "S(0),R", "P(sum),R");
  expect_reverse({7}, {7, 3}, "S(0),P(sum)", "R,S(0)", "S(1),S(0)", "S(0),P(sum)");
}

struct GradWant {
  const char *x, *y, *out, *dout, *dx, *dy;
};

void expect_grad(TensorSpec x, TensorSpec y, TensorSpec out, TensorSpec dout, GradWant w, const Attrs& attrs = {}) {
  std::vector<TensorSpec> in = {x, y, out, dout};
  SpmdResult r = rule().grad(mesh22(), in, attrs);
  ASSERT_EQ(r.inputs.size(), 4u);
  ASSERT_EQ(r.outputs.size(), 2u);
  std::string given = x.dist.to_string() + " | " + y.dist.to_string() + " | " + dout.dist.to_string();
  const char* names[] = {"x", "y", "out", "dout"};
  const char* want_in[] = {w.x, w.y, w.out, w.dout};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.inputs[i], parse_dist(want_in[i], 2)) << given << " -> " << names[i] << " " << r.inputs[i].to_string();
  }
  EXPECT_EQ(r.outputs[0], parse_dist(w.dx, 2)) << given << " -> dx " << r.outputs[0].to_string();
  EXPECT_EQ(r.outputs[1], parse_dist(w.dy, 2)) << given << " -> dy " << r.outputs[1].to_string();
}

TEST(MatmulRule, GradContractions) {
  // dx = dout y^T contracts n (mesh 1): Partial(sum); dy = x^T dout contracts m (mesh 0).
  expect_grad(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,S(1)"), spec({12, 12}, "S(0),S(1)"),
              spec({12, 12}, "S(0),S(1)"),
              {"S(0),R", "R,S(1)", "S(0),S(1)", "S(0),S(1)", "S(0),P(sum)", "P(sum),S(1)"});
  // k sharded: both grads keep the k shard; dout is replicated on that mesh dim.
  expect_grad(spec({12, 6}, "S(1),R"), spec({6, 12}, "S(0),R"), spec({12, 12}, "P(sum),R"),
              spec({12, 12}, "R,R"), {"S(1),R", "S(0),R", "P(sum),R", "R,R", "S(1),R", "S(0),R"});
  // dout alone decides: its m shard reaches x, its n shard reaches y.
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,R"), spec({12, 12}, "R,R"), spec({12, 12}, "S(0),S(1)"),
              {"S(0),R", "R,S(1)", "R,R", "S(0),S(1)", "S(0),P(sum)", "P(sum),S(1)"});
}

TEST(MatmulRule, GradPartials) {
  // dout P(sum) with x, y R: both grads P(sum). `out` keeps its distribution (not read).
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,R"), spec({12, 12}, "P(max),R"), spec({12, 12}, "P(sum),R"),
              {"R,R", "R,R", "P(max),R", "P(sum),R", "P(sum),R", "P(sum),R"});
  // x P(sum): dy is Partial, dx (from dout and y only) is replicated; dout's P(avg) on the same mesh
  // dim loses to x.
  expect_grad(spec({12, 6}, "P(sum),R"), spec({6, 12}, "R,R"), spec({12, 12}, "P(sum),R"),
              spec({12, 12}, "P(avg),R"), {"P(sum),R", "R,R", "P(sum),R", "R,R", "R,R", "P(sum),R"});
  // y P(avg): dx P(avg), dy replicated.
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,P(avg)"), spec({12, 12}, "R,P(avg)"),
              spec({12, 12}, "R,R"), {"R,R", "R,P(avg)", "R,P(avg)", "R,R", "R,P(avg)", "R,R"});
  // dout P(max): not linear, replicated.
  expect_grad(spec({12, 6}, "R,R"), spec({6, 12}, "R,R"), spec({12, 12}, "R,R"), spec({12, 12}, "P(max),R"),
              {"R,R", "R,R", "R,R", "R,R", "R,R", "R,R"});
  // Sharding beats Partial: dout's P(sum) on mesh 0 is reduced because x shards m there.
  expect_grad(spec({12, 6}, "S(0),R"), spec({6, 12}, "R,R"), spec({12, 12}, "S(0),R"), spec({12, 12}, "P(sum),R"),
              {"S(0),R", "R,R", "S(0),R", "S(0),R", "S(0),R", "P(sum),R"});
}

TEST(MatmulRule, GradBroadcastBatch) {
  // x [1, 4, 3] broadcasts over the batch that y shards: dx sums the batch -> Partial(sum).
  expect_grad(spec({1, 4, 3}, "R,R"), spec({2, 3, 5}, "S(0),R"), spec({2, 4, 5}, "S(0),R"),
              spec({2, 4, 5}, "S(0),R"), {"R,R", "S(0),R", "S(0),R", "S(0),R", "P(sum),R", "S(0),R"});
  // y [3, 4] has no batch dim: dy is Partial over x's batch shard (and over m).
  expect_grad(spec({2, 5, 3}, "S(0),S(1)"), spec({3, 4}, "R,R"), spec({2, 5, 4}, "S(0),S(1)"),
              spec({2, 5, 4}, "R,R"), {"S(0),S(1)", "R,R", "S(0),S(1)", "S(0),S(1)", "S(0),S(1)", "P(sum),P(sum)"});
}

TEST(MatmulRule, GradVectors) {
  // Dot product: dx = dout * y, dy = dout * x; k sharded on mesh 0, dout P(sum) on mesh 1.
  expect_grad(spec({12}, "S(0),R"), spec({12}, "R,R"), spec(Shape{}, "P(sum),R"), spec(Shape{}, "R,P(sum)"),
              {"S(0),R", "S(0),R", "P(sum),R", "R,P(sum)", "S(0),P(sum)", "S(0),P(sum)"});
  // 1-D y: dx = dout y^T is an outer product (no n to contract).
  expect_grad(spec({5, 7}, "R,S(1)"), spec({7}, "R,R"), spec({5}, "R,P(sum)"), spec({5}, "S(0),R"),
              {"S(0),S(1)", "R,S(0)", "R,P(sum)", "S(0),R", "S(0),S(1)", "P(sum),S(0)"});
}

}  // namespace
}  // namespace shardwise::spmd
