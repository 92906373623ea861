// The factor-description engine on toy descriptions, against answers derived by hand from the
// derivation in spmd/factor_rule.h (kept, contracted, broadcast and replicated factors; the Partial
// policy asked only on mesh dims that shard no factor; unread grad inputs keep their layout).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

Labels labels(std::string_view s) {
  Labels l;
  for (char c : s) l.push(c);
  return l;
}

// out[a, c] = sum_b x[a, b] * y[b, c] (a matmul); `r` lists replicated factors.
FactorRule contraction(const char* replicated = "") {
  FactorRule rule;
  rule.name = "toy_contraction";
  rule.num_inputs = 2;
  rule.describe = [replicated](std::span<const TensorSpec> in, const Attrs&) {
    Factors f;
    f.add_input(labels("ab"));
    f.add_input(labels("bc"));
    f.add_output(labels("ac"), Shape{in[0].shape[0], in[1].shape[1]});
    f.replicated = labels(replicated);
    return f;
  };
  rule.forward_partials = multilinear_forward;
  rule.reverse_partials = multilinear_reverse;
  rule.grad_partials = multilinear_grad;
  rule.grad_reads = 0b011;  // x, y; not out
  return rule;
}

TensorSpec spec(Shape shape, const char* dist, int mesh_ndim = 2) { return {shape, DType::F64, parse_dist(dist, mesh_ndim)}; }

std::string show(const SpmdResult& r) {
  std::string s;
  for (const auto& d : r.inputs) s += d.to_string() + " | ";
  s += "->";
  for (const auto& d : r.outputs) s += " " + d.to_string();
  return s;
}

const ProcessMesh k22(Shape{2, 2});

TEST(FactorRule, ForwardKeepsFactorsAndContractsToPartial) {
  Rule r = derive_rule(contraction());
  // x shards a on mesh dim 0 and b on mesh dim 1: out keeps a, b is contracted -> P(sum) there.
  std::vector<TensorSpec> in = {spec({4, 6}, "S(0),S(1)"), spec({6, 8}, "R,R")};
  EXPECT_EQ(show(r.forward(k22, in, {})), "S(0),S(1) | R,S(0) | -> S(0),P(sum)");
  // y shards b on mesh dim 0, but x's a claimed it first: y's shard loses (resharded to R).
  in = {spec({4, 6}, "S(0),R"), spec({6, 8}, "S(0),S(1)")};
  EXPECT_EQ(show(r.forward(k22, in, {})), "S(0),R | R,S(1) | -> S(0),S(1)");
}

TEST(FactorRule, PartialsAreAskedOnlyWhereNoFactorIsSharded) {
  Rule r = derive_rule(contraction());
  // Mesh dim 0 shards a: x's P(sum) on mesh dim 1 is free -> multilinear: x keeps it, out P(sum).
  std::vector<TensorSpec> in = {spec({4, 6}, "S(0),P(sum)"), spec({6, 8}, "R,P(avg)")};
  EXPECT_EQ(show(r.forward(k22, in, {})), "S(0),P(sum) | R,R | -> S(0),P(sum)");
  // y shards c on mesh dim 1, so x's P(sum) there loses to the sharding.
  in = {spec({4, 6}, "R,P(sum)"), spec({6, 8}, "R,S(1)")};
  EXPECT_EQ(show(r.forward(k22, in, {})), "R,R | R,S(1) | -> R,S(1)");
  // P(max) is not linear: resharded.
  in = {spec({4, 6}, "P(max),R"), spec({6, 8}, "R,R")};
  EXPECT_EQ(show(r.forward(k22, in, {})), "R,R | R,R | -> R,R");
}

TEST(FactorRule, ReplicatedFactorsAreNeverSharded) {
  Rule r = derive_rule(contraction("b"));
  std::vector<TensorSpec> in = {spec({4, 6}, "S(0),S(1)"), spec({6, 8}, "S(0),R")};
  EXPECT_EQ(show(r.forward(k22, in, {})), "S(0),R | R,R | -> S(0),R");
  // A wanted P(sum) cannot become a shard of the (replicated) contracted factor: the table decides.
  std::vector<TensorSpec> out = {spec({4, 8}, "P(sum),R")};
  EXPECT_EQ(show(r.reverse(k22, in, out, {})), "P(sum),R | R,R | -> P(sum),R");
}

TEST(FactorRule, ReverseTurnsAWantedContractionPartialIntoAShard) {
  Rule r = derive_rule(contraction());
  std::vector<TensorSpec> in = {spec({4, 6}, "R,R"), spec({6, 8}, "R,R")};
  std::vector<TensorSpec> out = {spec({4, 8}, "P(sum),S(0)")};
  EXPECT_EQ(show(r.reverse(k22, in, out, {})), "S(1),S(0) | S(0),R | -> P(sum),S(0)");
  out = {spec({4, 8}, "P(avg),R")};  // not the contraction op: the multilinear table asks x alone
  EXPECT_EQ(show(r.reverse(k22, in, out, {})), "P(avg),R | R,R | -> P(avg),R");
  out = {spec({5, 8}, "R,R")};
  EXPECT_THROW(r.reverse(k22, in, out, {}), Error);
}

TEST(FactorRule, GradSumsOverFactorsAnInputLacksAndKeepsUnreadTensors) {
  Rule r = derive_rule(contraction());
  // x, y, out, dout. dx = dout y^T lacks c, dy = x^T dout lacks a: Partial(sum) where those are
  // sharded. out is not read: it keeps its (Partial) layout.
  std::vector<TensorSpec> g = {spec({4, 6}, "S(0),R"), spec({6, 8}, "R,S(1)"), spec({4, 8}, "P(sum),R"),
                               spec({4, 8}, "R,R")};
  EXPECT_EQ(show(r.grad(k22, g, {})), "S(0),R | R,S(1) | P(sum),R | S(0),S(1) | -> S(0),P(sum) P(sum),S(1)");
  // dout P(avg) on a free mesh dim passes to both gradients.
  g = {spec({4, 6}, "S(0),R"), spec({6, 8}, "R,R"), spec({4, 8}, "R,R"), spec({4, 8}, "R,P(avg)")};
  EXPECT_EQ(show(r.grad(k22, g, {})), "S(0),R | R,R | R,R | S(0),P(avg) | -> S(0),P(avg) P(sum),P(avg)");
}

TEST(FactorRule, NoGradInputsAreReportedReplicate) {
  FactorRule rule = contraction();
  rule.no_grad = 0b01;  // x takes no gradient
  Rule r = derive_rule(std::move(rule));
  std::vector<TensorSpec> g = {spec({4, 6}, "S(0),R"), spec({6, 8}, "R,R"), spec({4, 8}, "R,R"),
                               spec({4, 8}, "R,P(sum)")};
  EXPECT_EQ(show(r.grad(k22, g, {})), "S(0),R | R,R | R,R | S(0),P(sum) | -> R,R P(sum),P(sum)");
}

TEST(FactorRule, IncompleteRulesAndBadCallsAreErrors) {
  FactorRule rule = contraction();
  rule.grad_partials = nullptr;
  EXPECT_THROW(derive_rule(std::move(rule)), Error);
  Rule r = derive_rule(contraction());
  std::vector<TensorSpec> one = {spec({4, 6}, "R,R")};
  try {
    r.forward(k22, one, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("toy_contraction"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::spmd
