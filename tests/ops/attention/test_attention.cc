// The attention family: flash_attention's kernels against a double-precision naive attention written
// here (causal and document masks, grouped-query heads, S across tile edges and S = 1, dropout with
// the `dropout` op's own mask) and central differences, its rule's answers derived by hand, its
// registry entries. (The verifier proves the rule on every mesh: tests/verify/test_every_rule.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/attention/kernels.h"
#include "shardwise/ops/op.h"
#include "tests/ops/attention/attention_inputs.h"
#include "tests/ops/numeric_grad.h"

namespace shardwise::ops {
namespace {

using mesh::parse_dist;
using spmd::SpmdResult;
using spmd::TensorSpec;
using testing_attention::documents;
using testing_attention::random_f64;

struct Problem {
  int64_t B, G, R, S, D;
  bool grouped;  // q [B, G, R, S, D]; else [B, G, S, D] (R = 1)
  Shape q() const { return grouped ? Shape{B, G, R, S, D} : Shape{B, G, S, D}; }
  Shape kv() const { return Shape{B, G, S, D}; }
};

// The textbook attention in double: out[b, g, r, i] = sum_j softmax_j(visible ? (q . k) scale : -inf)
// * keep[b, h, i, j] / (1 - p) * v[b, g, j], lse the log of the softmax's normalizer.
struct Reference {
  std::vector<double> out, lse;
};
Reference naive(const Problem& pb, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc, double scale,
                const Tensor& keep = Tensor(), double p = 0.0) {
  const int64_t S = pb.S, D = pb.D, NH = pb.G * pb.R;
  Reference r{std::vector<double>(static_cast<size_t>(q.numel())), std::vector<double>(static_cast<size_t>(q.numel() / D))};
  for (int64_t b = 0; b < pb.B; ++b)
    for (int64_t g = 0; g < pb.G; ++g)
      for (int64_t rr = 0; rr < pb.R; ++rr) {
        const int64_t h = g * pb.R + rr, head = (b * pb.G + g) * pb.R + rr, kvh = b * pb.G + g;
        for (int64_t i = 0; i < S; ++i) {
          std::vector<double> s(static_cast<size_t>(S), -INFINITY);
          double mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            if (doc.defined() && doc.at(b * S + j) != doc.at(b * S + i)) continue;
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += q.at((head * S + i) * D + d) * scale * k.at((kvh * S + j) * D + d);
            s[static_cast<size_t>(j)] = dot;
            mx = std::max(mx, dot);
          }
          double z = 0;
          for (int64_t j = 0; j < S; ++j) z += std::exp(s[static_cast<size_t>(j)] - mx);
          r.lse[static_cast<size_t>(head * S + i)] = mx + std::log(z);
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t j = 0; j < S; ++j) {
              double pr = std::exp(s[static_cast<size_t>(j)] - mx) / z;
              if (keep.defined()) pr *= keep.at(((b * NH + h) * S + i) * S + j) / (1.0 - p);
              acc += pr * v.at((kvh * S + j) * D + d);
            }
            r.out[static_cast<size_t>((head * S + i) * D + d)] = acc;
          }
        }
      }
  return r;
}

void expect_matches(const AttentionOutputs& got, const Reference& want, double tol, const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.out.numel()), want.out.size()) << what;
  for (int64_t i = 0; i < got.out.numel(); ++i)
    ASSERT_NEAR(got.out.at(i), want.out[static_cast<size_t>(i)], tol) << what << " out " << i;
  for (int64_t i = 0; i < got.lse.numel(); ++i)
    ASSERT_NEAR(got.lse.at(i), want.lse[static_cast<size_t>(i)], tol * 4) << what << " lse " << i;
}

AttentionArgs args(double scale, double p = 0.0) {
  AttentionArgs a;
  a.scale = scale;
  a.p = p;
  a.seed = 1234;
  a.stream = 77;
  return a;
}

// The `dropout` op's keep mask (u8) over probabilities [B, NH, S, S], drawn by that op itself.
Tensor dropout_op_mask(const Shape& probs, double p) {
  const OpDef& op = op_registry().get("dropout");
  Attrs a{{"p", p}, {"seed", int64_t{1234}}, {"stream", int64_t{77}}, {"training", true}};
  std::vector<Tensor> in{Tensor::full(DType::F32, probs, 1.0)};
  return run_forward(op, in, a)[1];
}

TEST(FlashAttentionKernel, MatchesTheNaiveAttentionAcrossTilesGroupsAndDocuments) {
  const Problem problems[] = {{2, 3, 1, 70, 5, false},   // S across the 64-key tile edge
                              {1, 2, 2, 130, 4, true},   // grouped-query, three tiles
                              {1, 1, 1, 1, 3, false},    // S = 1
                              {2, 2, 3, 67, 4, true}};   // grouped, with documents below
  for (const Problem& pb : problems) {
    Tensor q = random_f64(pb.q(), 1), k = random_f64(pb.kv(), 2), v = random_f64(pb.kv(), 3);
    for (bool docs : {false, true}) {
      Tensor doc = docs ? documents(pb.B, pb.S) : Tensor();
      const std::string what = pb.q().to_string() + (docs ? " docs" : "");
      const Reference want = naive(pb, q, k, v, doc, 0.4);
      expect_matches(flash_attention(q, k, v, doc, args(0.4)), want, 1e-12, what + " f64");
      expect_matches(flash_attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), doc, args(0.4)), want, 2e-5,
                     what + " f32");
      // bf16 inputs and outputs, computed in float: the reference on the rounded inputs, out rounded once.
      Tensor qb = q.to(DType::BF16), kb = k.to(DType::BF16), vb = v.to(DType::BF16);
      const Reference want_b = naive(pb, qb, kb, vb, doc, 0.4);
      expect_matches(flash_attention(qb, kb, vb, doc, args(0.4)), want_b, 2e-2, what + " bf16");
    }
  }
}

TEST(FlashAttentionKernel, DropoutKeepsTheDropoutOpsMaskOfTheProbabilities) {
  const Problem pb{2, 2, 3, 70, 4, true};
  Tensor q = random_f64(pb.q(), 4), k = random_f64(pb.kv(), 5), v = random_f64(pb.kv(), 6);
  const Shape probs{pb.B, pb.G * pb.R, pb.S, pb.S};
  Tensor keep = dropout_op_mask(probs, 0.3);
  expect_matches(flash_attention(q, k, v, Tensor(), args(0.4, 0.3)), naive(pb, q, k, v, Tensor(), 0.4, keep, 0.3),
                 1e-12, "dropout");
  // p = 0.3 with training off is no dropout.
  AttentionArgs eval = args(0.4, 0.3);
  eval.training = false;
  expect_matches(flash_attention(q, k, v, Tensor(), eval), naive(pb, q, k, v, Tensor(), 0.4), 1e-12, "eval");
  // A block of a larger global tensor (kv group 1 of 2, batch rows from sample 3): the dropout op's
  // mask of the global probabilities [3 + B, NH, S, S] at those rows and heads.
  const Problem one{pb.B, 1, pb.R, pb.S, pb.D, true};
  Tensor q1 = q.slice(std::vector<int64_t>{0, 1, 0, 0, 0}, one.q()), k1 = k.slice(std::vector<int64_t>{0, 1, 0, 0}, one.kv()),
         v1 = v.slice(std::vector<int64_t>{0, 1, 0, 0}, one.kv());
  Tensor global_keep = dropout_op_mask(Shape{3 + pb.B, pb.G * pb.R, pb.S, pb.S}, 0.3);
  Tensor keep1 = global_keep.slice(std::vector<int64_t>{3, pb.R, 0, 0}, Shape{pb.B, pb.R, pb.S, pb.S});
  AttentionCoords at;
  at.batch0 = 3;
  at.groups = 2;
  at.group0 = 1;
  at.reps = pb.R;
  expect_matches(flash_attention(q1, k1, v1, Tensor(), args(0.4, 0.3), at), naive(one, q1, k1, v1, Tensor(), 0.4, keep1, 0.3),
                 1e-12, "shard");
}

void expect_grads(const Problem& pb, const Tensor& doc, const AttentionArgs& a, const std::string& what) {
  Tensor q = random_f64(pb.q(), 7), k = random_f64(pb.kv(), 8), v = random_f64(pb.kv(), 9), w = random_f64(pb.q(), 10);
  AttentionOutputs o = flash_attention(q, k, v, doc, a);
  AttentionGrads g = flash_attention_backward(q, k, v, doc, o.out, o.lse, w, a);
  auto out = [&] { return flash_attention(q, k, v, doc, a).out; };
  const std::pair<Tensor*, Tensor*> pairs[] = {{&q, &g.dq}, {&k, &g.dk}, {&v, &g.dv}};
  for (auto [x, dx] : pairs) {
    std::vector<double> want = testing_util::numeric_grad(*x, w, out);
    ASSERT_EQ(dx->shape(), x->shape()) << what;
    for (int64_t i = 0; i < x->numel(); ++i) ASSERT_NEAR(dx->at(i), want[static_cast<size_t>(i)], 1e-6) << what << " " << i;
  }
}

TEST(FlashAttentionKernel, BackwardMatchesCentralDifferences) {
  expect_grads({1, 2, 1, 69, 2, false}, Tensor(), args(0.6), "causal, two tiles");
  expect_grads({1, 1, 3, 20, 3, true}, documents(1, 20), args(0.6, 0.25), "grouped, documents, dropout");
  expect_grads({2, 1, 2, 1, 2, true}, Tensor(), args(0.6, 0.5), "S = 1, dropout");
}

// f32 against f64 on the same inputs; bf16 against f64 on the bf16-rounded inputs (the kernel
// computes in float from them; its out and gradients are rounded once more), to 2e-2: a dropout
// rescale 1 / (1 - p) = 1.25 left out, or applied twice, is off by 25%.
TEST(FlashAttentionKernel, FloatBackwardFollowsF64) {
  const Problem pb{1, 2, 2, 70, 8, true};
  Tensor q = random_f64(pb.q(), 11), k = random_f64(pb.kv(), 12), v = random_f64(pb.kv(), 13), w = random_f64(pb.q(), 14);
  Tensor doc = documents(1, 70);
  auto grads = [&](DType dt, DType rounded_to) {
    auto in = [&](const Tensor& x) { return x.to(rounded_to).to(dt); };
    Tensor qq = in(q), kk = in(k), vv = in(v), ww = in(w);
    AttentionOutputs o = flash_attention(qq, kk, vv, doc, args(0.35, 0.2));
    return flash_attention_backward(qq, kk, vv, doc, o.out, o.lse, ww, args(0.35, 0.2));
  };
  const AttentionGrads ref = grads(DType::F64, DType::F64), f32 = grads(DType::F32, DType::F32),
                       ref_b = grads(DType::F64, DType::BF16), b16 = grads(DType::BF16, DType::BF16);
  for (auto [got, want, tol] : {std::tuple{&f32, &ref, 1e-4}, std::tuple{&b16, &ref_b, 2e-2}}) {
    const std::pair<const Tensor*, const Tensor*> pairs[] = {{&got->dq, &want->dq}, {&got->dk, &want->dk}, {&got->dv, &want->dv}};
    for (auto [x, r] : pairs) {
      for (int64_t i = 0; i < r->numel(); ++i) ASSERT_NEAR(x->at(i), r->at(i), tol * std::max(1.0, std::abs(r->at(i)))) << i;
    }
  }
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(FlashAttentionKernel, BadInputsAreErrorsNamingTheProblem) {
  Tensor q = random_f64({1, 4, 5, 2}, 1), kv = random_f64({1, 2, 5, 2}, 2);
  EXPECT_NE(message([&] { flash_attention(q, kv, kv, Tensor(), args(1.0)); }).find("needs k and v 1x4x5x2 (one kv head per query head)"),
            std::string::npos);
  Tensor q5 = random_f64({1, 2, 2, 5, 2}, 1);
  EXPECT_EQ(message([&] { flash_attention(q5, kv, kv, Tensor(), args(1.0)); }), "no error");
  EXPECT_NE(message([&] { flash_attention(q5, kv, kv, Tensor(DType::I64, Shape{1, 4}), args(1.0)); })
                .find("document ids must be [1, 5]"),
            std::string::npos);
  EXPECT_NE(message([&] { flash_attention(q5, kv.to(DType::F32), kv, Tensor(), args(1.0)); }).find("share a dtype"),
            std::string::npos);
  EXPECT_NE(message([&] { attention_args(Attrs{{"scale", 1.0}, {"p", 0.1}}); }).find("'seed'"), std::string::npos);
  EXPECT_NE(message([&] { attention_args(Attrs{{"p", 0.1}}); }).find("'scale'"), std::string::npos);
  EXPECT_NE(message([&] { attention_args(Attrs{{"scale", 1.0}, {"p", 1.0}}); }).find("[0, 1)"), std::string::npos);
}

// ---- rule (answers derived by hand from the file comment of ops/attention/rules.cc)

const mesh::ProcessMesh k22(Shape{2, 2});
TensorSpec spec(Shape s, const char* dist, DType dt = DType::F32) { return {s, dt, parse_dist(dist, 2)}; }

std::string show(const SpmdResult& r) {
  std::string s;
  for (const auto& d : r.inputs) s += d.to_string() + " | ";
  s += "->";
  for (const auto& d : r.outputs) s += " " + d.to_string();
  return s;
}

TEST(FlashAttentionRule, BatchAndHeadsPassSequencesAndHeadDimAreReplicated) {
  const spmd::Rule& rule = op_registry().get("flash_attention").rule;
  const Shape q{4, 6, 8, 4};
  // dp on the batch, tp on the heads: k and v follow q.
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(q, "S(0),S(1)"), spec(q, "R,R"), spec(q, "R,R")}, {})),
            "S(0),S(1) | S(0),S(1) | S(0),S(1) | -> S(0),S(1) S(0),S(1)");
  // Context parallelism: q's sequence shard stays (out and lse follow it), k and v are gathered
  // whole (a key-sequence or head-dim shard too); a Partial is resharded.
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(q, "S(2),P(sum)"), spec(q, "S(3),R"), spec(q, "R,S(2)")}, {})),
            "S(2),R | R,R | R,R | -> S(2),R S(2),R");
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(q, "S(3),R"), spec(q, "R,R"), spec(q, "R,R")}, {})),
            "R,R | R,R | R,R | -> R,R R,R");
  // The grad (q, k, v, out, lse, dout, dlse): dq on q's sequence shard, dk and dv Partial(sum)
  // over it (each rank's queries' share of every key's gradient).
  const Shape l3{4, 6, 8};
  std::vector<TensorSpec> gs = {spec(q, "S(2),S(0)"), spec(q, "R,S(0)"), spec(q, "R,S(0)"), spec(q, "S(2),S(0)"),
                                spec(l3, "S(2),S(0)"), spec(q, "S(2),S(0)"), spec(l3, "R,R")};
  const std::string gr = show(rule.grad(k22, gs, {}));
  EXPECT_EQ(gr.substr(gr.find("->")), "-> S(2),S(0) P(sum),S(0) P(sum),S(0)");
  // Grouped q [B, G, R, S, D] (placements per mesh dim: mesh dim 0 on the repeats or the groups,
  // mesh dim 1 on the batch): the repeats leave k and v whole there; the groups shard them.
  const Shape g5{4, 2, 3, 8, 4}, kv{4, 2, 8, 4};
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(g5, "S(2),S(0)"), spec(kv, "R,R"), spec(kv, "R,R")}, {})),
            "S(2),S(0) | R,S(0) | R,S(0) | -> S(2),S(0) S(2),S(0)");
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(g5, "S(1),S(0)"), spec(kv, "R,R"), spec(kv, "R,R")}, {})),
            "S(1),S(0) | S(1),S(0) | S(1),S(0) | -> S(1),S(0) S(1),S(0)");
  // k's group shard alone shards q's groups (the letter is shared).
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(g5, "R,R"), spec(kv, "R,S(1)"), spec(kv, "R,R")}, {})),
            "R,S(1) | R,S(1) | R,S(1) | -> R,S(1) R,S(1)");
}

TEST(FlashAttentionRule, DocumentIdsFollowTheBatchAndGradientsFollowTheInputs) {
  const spmd::Rule& rule = op_registry().get("flash_attention_docs").rule;
  const Shape q{4, 6, 8, 4}, lse{4, 6, 8}, ids{4, 8};
  // The ids' batch shard (mesh dim 0) shards q's batch; q's heads take mesh dim 1.
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(q, "R,S(1)"), spec(q, "R,R"), spec(q, "R,R"),
                                                           spec(ids, "S(0),R", DType::I64)},
                              {})),
            "S(0),S(1) | S(0),S(1) | S(0),S(1) | S(0),R | -> S(0),S(1) S(0),S(1)");
  // A mesh dim sharding the ids' key sequence is gathered.
  EXPECT_EQ(show(rule.forward(k22, std::vector<TensorSpec>{spec(q, "S(0),R"), spec(q, "R,R"), spec(q, "R,R"),
                                                           spec(ids, "R,S(1)", DType::I64)},
                              {})),
            "S(0),R | S(0),R | S(0),R | S(0),R | -> S(0),R S(0),R");
  // q, k, v, ids, out, lse, dout, dlse: dq, dk, dv on the merged layout, the ids none.
  std::vector<TensorSpec> g = {spec(q, "S(0),S(1)"), spec(q, "S(0),S(1)"), spec(q, "S(0),S(1)"),
                               spec(ids, "R,S(0)", DType::I64), spec(q, "S(0),S(1)"), spec(lse, "S(0),S(1)"),
                               spec(q, "S(0),S(1)"), spec(lse, "R,R")};
  const std::string r = show(rule.grad(k22, g, {}));
  EXPECT_EQ(r.substr(r.find("->")), "-> S(0),S(1) S(0),S(1) S(0),S(1) R,R");
}

// ---- registry entries

TEST(FlashAttentionOps, Entries) {
  for (const char* name : {"flash_attention", "flash_attention_docs"}) {
    const OpDef& op = op_registry().get(name);
    EXPECT_EQ(op.family, "attention");
    EXPECT_EQ(op.rule.name, name);
    EXPECT_EQ(op.num_outputs, 2);
    EXPECT_TRUE(op.has_backward());
  }
  EXPECT_EQ(op_registry().get("flash_attention").num_inputs, 3);
  EXPECT_EQ(op_registry().get("flash_attention_docs").num_inputs, 4);
}

}  // namespace
}  // namespace shardwise::ops
