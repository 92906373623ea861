// softmax and cross_entropy rules against hand-derived expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

const ProcessMesh kMesh22(Shape{2, 2});

std::string join(const std::vector<DistAttr>& dists) {
  std::string out;
  for (size_t i = 0; i < dists.size(); ++i) out += (i ? " | " : "") + dists[i].to_string();
  return out;
}

TensorSpec spec(Shape s, const std::string& dist, DType dtype = DType::F64) {
  return {s, dtype, parse_dist(dist, kMesh22.ndim())};
}

Attrs axis(int64_t a) { return Attrs{{"axis", a}}; }

std::string sm_fwd(Shape x, int64_t a, const std::string& d) {
  std::vector<TensorSpec> in = {spec(x, d)};
  SpmdResult r = rules().get("softmax").forward(kMesh22, in, axis(a));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string sm_rev(Shape x, int64_t a, const std::string& want) {
  std::vector<TensorSpec> in = {spec(x, "R,R")}, out = {spec(x, want)};
  SpmdResult r = rules().get("softmax").reverse(kMesh22, in, out, axis(a));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string sm_grad(Shape x, int64_t a, const std::string& dx, const std::string& dout, const std::string& ddout) {
  std::vector<TensorSpec> in = {spec(x, dx), spec(x, dout), spec(x, ddout)};
  SpmdResult r = rules().get("softmax").grad(kMesh22, in, axis(a));
  return join(r.inputs) + " -> " + join(r.outputs);
}

TEST(SoftmaxRules, RegisteredWithSummaries) {
  for (const char* name : {"softmax", "cross_entropy", "vocab_parallel_cross_entropy"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "softmax");
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(SoftmaxRules, AxisReplicatedOtherDimsKept) {
  EXPECT_EQ(sm_fwd({4, 6}, -1, "S(0),S(1)"), "S(0),R -> S(0),R");
  EXPECT_EQ(sm_fwd({4, 6}, 0, "S(0),S(1)"), "R,S(1) -> R,S(1)");
  EXPECT_EQ(sm_fwd({4, 6}, -1, "P(avg),S(0)"), "R,S(0) -> R,S(0)");
  EXPECT_EQ(sm_fwd({4, 6}, -1, "P(max),P(sum)"), "R,R -> R,R");
  EXPECT_EQ(sm_fwd({2, 3, 4}, 1, "S(1),S(2)"), "R,S(2) -> R,S(2)");
  EXPECT_EQ(sm_fwd({4, 6}, 1, "S(0)@1,S(0)@0"), "S(0)@1,S(0)@0 -> S(0)@1,S(0)@0");
  std::vector<TensorSpec> bad = {spec({4, 6}, "R,R")};
  EXPECT_THROW(rules().get("softmax").forward(kMesh22, bad, axis(2)), Error);
}

TEST(SoftmaxRules, ReverseAndGrad) {
  EXPECT_EQ(sm_rev({4, 6}, -1, "S(1),P(sum)"), "R,R -> R,R");
  EXPECT_EQ(sm_rev({4, 6}, 0, "S(1),S(0)"), "S(1),R -> S(1),R");
  // x is not read (kept); out and dout merge (out first); dout P(avg) on the free mesh dim passes.
  EXPECT_EQ(sm_grad({4, 6}, -1, "P(max),S(1)", "S(0),R", "R,P(avg)"),
            "P(max),S(1) | S(0),R | S(0),P(avg) -> S(0),P(avg)");
  EXPECT_EQ(sm_grad({4, 6}, -1, "R,R", "R,S(0)", "S(0),P(sum)"), "R,R | R,S(0) | R,S(0) -> R,S(0)");
  EXPECT_EQ(sm_grad({4, 6}, 0, "R,R", "S(0),S(1)", "P(max),R"), "R,R | R,S(1) | R,S(1) -> R,S(1)");
}

Attrs ce(const char* reduction) { return Attrs{{"reduction", std::string(reduction)}}; }

Shape batch_of(const Shape& logits) {
  Shape s;
  for (int d = 0; d + 1 < logits.ndim(); ++d) s.push_back(logits[d]);
  return s;
}

constexpr const char* kVp = "vocab_parallel_cross_entropy";

std::string ce_fwd(Shape logits, const std::string& dl, const std::string& dy, const char* reduction,
                   const char* rule = "cross_entropy") {
  std::vector<TensorSpec> in = {spec(logits, dl), spec(batch_of(logits), dy, DType::I64)};
  SpmdResult r = rules().get(rule).forward(kMesh22, in, ce(reduction));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string ce_rev(Shape logits, const std::string& dl, const std::string& want, const char* reduction,
                   const char* rule = "cross_entropy") {
  std::vector<TensorSpec> in = {spec(logits, dl), spec(batch_of(logits), "R,R", DType::I64)};
  Shape loss = std::string(reduction) == "none" ? batch_of(logits) : Shape{};
  std::vector<TensorSpec> out = {spec(loss, want)};
  SpmdResult r = rules().get(rule).reverse(kMesh22, in, out, ce(reduction));
  return join(r.inputs) + " -> " + join(r.outputs);
}

std::string ce_grad(Shape logits, std::vector<std::string> d, const char* reduction,
                    const char* rule = "cross_entropy") {
  Shape loss = std::string(reduction) == "none" ? batch_of(logits) : Shape{};
  std::vector<TensorSpec> in = {spec(logits, d[0]), spec(batch_of(logits), d[1], DType::I64), spec(loss, d[2]),
                                spec(loss, d[3])};
  SpmdResult r = rules().get(rule).grad(kMesh22, in, ce(reduction));
  EXPECT_EQ(r.outputs.size(), 2u);
  return join(r.inputs) + " -> " + join(r.outputs);
}

TEST(CrossEntropyRules, ForwardPerReduction) {
  // The class dim is Replicate; a sharded batch gives P(sum) for sum, a sharded loss for none,
  // and is resharded for mean (the divisor is the global count of non-ignored labels).
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "sum"), "S(0),R | S(0),R -> P(sum),R");
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "none"), "S(0),R | S(0),R -> S(0),R");
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "S(0),R", "mean"), "R,R | R,R -> R,R");
  // labels define the batch sharding when logits do not; Partials are resharded.
  EXPECT_EQ(ce_fwd({4, 6}, "P(sum),R", "S(0),P(sum)", "none"), "S(0),R | S(0),R -> S(0),R");
  // logits win a conflict.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),R", "R,S(0)", "sum"), "S(0),R | S(0),R -> P(sum),R");
  // Two batch dims, each on its own mesh dim.
  EXPECT_EQ(ce_fwd({2, 3, 4}, "S(1),S(0)", "R,R", "sum"), "S(1),S(0) | S(1),S(0) -> P(sum),P(sum)");
  // Errors: labels of the wrong shape, an unknown reduction.
  std::vector<TensorSpec> bad = {spec({4, 6}, "R,R"), spec({6}, "R,R", DType::I64)};
  EXPECT_THROW(rules().get("cross_entropy").forward(kMesh22, bad, ce("sum")), Error);
  std::vector<TensorSpec> good = {spec({4, 6}, "R,R"), spec({4}, "R,R", DType::I64)};
  EXPECT_THROW(rules().get("cross_entropy").forward(kMesh22, good, ce("avg")), Error);
}

TEST(CrossEntropyRules, Reverse) {
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "P(sum),R", "sum"), "S(0),R | S(0),R -> P(sum),R");
  // The given logits' batch shard on a mesh dim is reused for the wanted P(sum) there.
  EXPECT_EQ(ce_rev({2, 3, 4}, "S(1),R", "P(sum),P(sum)", "sum"), "S(1),S(0) | S(1),S(0) -> P(sum),P(sum)");
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "P(max),R", "sum"), "R,R | R,R -> R,R");
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "R,S(0)", "none"), "R,S(0) | R,S(0) -> R,S(0)");
  EXPECT_EQ(ce_rev({4, 6}, "R,R", "P(sum),S(0)", "none"), "R,S(0) | R,S(0) -> R,S(0)");
  EXPECT_EQ(ce_rev({4, 6}, "S(0),R", "P(sum),R", "mean"), "R,R | R,R -> R,R");
}

TEST(CrossEntropyRules, Grad) {
  // none: dloss joins the batch merge; its P(sum) on the free mesh dim passes to dlogits.
  EXPECT_EQ(ce_grad({4, 6}, {"R,R", "R,R", "P(sum),R", "S(0),P(sum)"}, "none"),
            "S(0),R | S(0),R | P(sum),R | S(0),P(sum) -> S(0),P(sum) | S(0),R");
  // sum: the scalar dloss is Replicate where the batch is sharded, P(avg) passes elsewhere.
  EXPECT_EQ(ce_grad({4, 6}, {"S(0),R", "R,R", "P(sum),R", "P(sum),P(avg)"}, "sum"),
            "S(0),R | S(0),R | P(sum),R | R,P(avg) -> S(0),P(avg) | S(0),R");
  // mean: everything Replicate; dloss P(sum) passes to dlogits.
  EXPECT_EQ(ce_grad({4, 6}, {"S(0),S(1)", "S(0),R", "R,R", "P(sum),P(max)"}, "mean"),
            "R,R | R,R | R,R | P(sum),R -> P(sum),R | R,R");
}

TEST(VocabParallelCrossEntropyRules, ClassDimStaysSharded) {
  // The class dim keeps its sharding (co-sharded too); labels and loss are Replicate on it.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "sum", kVp), "S(0),S(1) | S(0),R -> P(sum),R");
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "none", kVp), "S(0),S(1) | S(0),R -> S(0),R");
  EXPECT_EQ(ce_fwd({4, 5}, "S(1),S(1)", "S(0),R", "none", kVp), "S(1),S(1) | R,R -> R,R");
  // mean: the batch is Replicate (global divisor), the class dim is not.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "mean", kVp), "R,S(1) | R,R -> R,R");
  // Partial logits -> R; labels' batch sharding is taken where logits have none.
  EXPECT_EQ(ce_fwd({4, 6}, "P(sum),S(1)", "S(0),R", "sum", kVp), "S(0),S(1) | S(0),R -> P(sum),R");
  // The same inputs under cross_entropy lose the class sharding.
  EXPECT_EQ(ce_fwd({4, 6}, "S(0),S(1)", "R,R", "sum"), "S(0),R | S(0),R -> P(sum),R");
}

TEST(VocabParallelCrossEntropyRules, ReverseKeepsTheGivenClassSharding) {
  EXPECT_EQ(ce_rev({4, 6}, "R,S(1)", "P(sum),R", "sum", kVp), "S(0),S(1) | S(0),R -> P(sum),R");
  EXPECT_EQ(ce_rev({4, 6}, "S(1),R", "R,R", "mean", kVp), "S(1),R | R,R -> R,R");
  // The wanted loss takes mesh dim 1 for the batch; the class keeps mesh dim 0.
  EXPECT_EQ(ce_rev({4, 6}, "S(1),S(1)", "R,S(0)", "none", kVp), "S(1),S(0) | R,S(0) -> R,S(0)");
}

TEST(VocabParallelCrossEntropyRules, Grad) {
  // dlogits keeps the class sharding; dloss (none) follows labels.
  EXPECT_EQ(ce_grad({4, 6}, {"R,S(1)", "R,R", "R,R", "S(0),R"}, "none", kVp),
            "S(0),S(1) | S(0),R | R,R | S(0),R -> S(0),S(1) | S(0),R");
  // A dloss Partial on the class-sharding mesh dim cannot pass: Replicate there.
  EXPECT_EQ(ce_grad({4, 6}, {"R,S(1)", "R,R", "R,R", "P(sum),P(sum)"}, "sum", kVp),
            "R,S(1) | R,R | R,R | P(sum),R -> P(sum),S(1) | R,R");
}

}  // namespace
}  // namespace shardwise::spmd
