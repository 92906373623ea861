// Context parallelism in the attention kernels, against the whole-sequence kernel (itself checked
// against a naive attention in test_attention.cc): a block of query rows [x0, x0 + n) attending
// the whole sequence of keys gives those rows of the output and of dq, and the blocks' dk, dv sum
// to the whole one's; a sequence stored in cp's balanced order gives the reordered output of the
// sequence in its natural order (dropout's mask included); and the balanced order gives every cp
// rank the same number of visible (query, key) pairs where a contiguous split does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/attention/kernels.h"
#include "tests/ops/attention/attention_inputs.h"

namespace shardwise::ops {
namespace {

using namespace testing_attention;  // NOLINT: the shared inputs and comparisons

AttentionArgs args(double p = 0.0, int64_t balanced = 1) {
  AttentionArgs a;
  a.scale = 0.45;
  a.p = p;
  a.seed = 99;
  a.stream = 5;
  a.balanced_ranks = balanced;
  return a;
}

// t reordered along dim `dim`: out[.., x, ..] = t[.., order[x], ..].
Tensor reorder(const Tensor& t, int dim, const std::vector<int64_t>& order) {
  Tensor out(t.dtype(), t.shape());
  int64_t inner = 1, outer = 1;
  for (int d = dim + 1; d < t.shape().ndim(); ++d) inner *= t.shape()[d];
  for (int d = 0; d < dim; ++d) outer *= t.shape()[d];
  const int64_t n = t.shape()[dim];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t x = 0; x < n; ++x)
      for (int64_t i = 0; i < inner; ++i)
        out.set_at((o * n + x) * inner + i, t.at((o * n + order[static_cast<size_t>(x)]) * inner + i));
  return out;
}

// q [B, G, R, T, D] (grouped) or [B, G, T, D]; k, v [B, G, T, D]; blocks of `n` query rows.
void expect_blocks_match(bool grouped, int64_t T, int64_t n, bool docs, double p, int64_t balanced) {
  const int64_t B = 2, G = 2, R = 2, D = 3;
  const Shape qs = grouped ? Shape{B, G, R, T, D} : Shape{B, G, T, D}, kvs{B, G, T, D};
  const int qdim = qs.ndim() - 2;
  Tensor q = random_f64(qs, 1), k = random_f64(kvs, 2), v = random_f64(kvs, 3), w = random_f64(qs, 4);
  Tensor doc = docs ? documents(B, T) : Tensor();
  const AttentionArgs a = args(p, balanced);
  const AttentionOutputs whole = flash_attention(q, k, v, doc, a);
  const AttentionGrads wg = flash_attention_backward(q, k, v, doc, whole.out, whole.lse, w, a);
  Tensor dk(DType::F64, kvs), dv(DType::F64, kvs);
  const std::string what = qs.to_string() + " block " + std::to_string(n) + (docs ? " docs" : "") +
                           (p > 0 ? " dropout" : "") + " balanced " + std::to_string(balanced);
  for (int64_t x0 = 0; x0 < T; x0 += n) {
    const int64_t m = std::min(n, T - x0);
    AttentionCoords at;
    at.query0 = x0;
    Tensor qb = rows(q, qdim, x0, m), wb = rows(w, qdim, x0, m);
    const AttentionOutputs o = flash_attention(qb, k, v, doc, a, at);
    expect_near(o.out, rows(whole.out, qdim, x0, m), 1e-12, what + " out");
    expect_near(o.lse, rows(whole.lse, qdim, x0, m), 1e-12, what + " lse");
    const AttentionGrads g = flash_attention_backward(qb, k, v, doc, o.out, o.lse, wb, a, at);
    expect_near(g.dq, rows(wg.dq, qdim, x0, m), 1e-12, what + " dq");
    for (int64_t i = 0; i < dk.numel(); ++i) dk.set_at(i, dk.at(i) + g.dk.at(i)), dv.set_at(i, dv.at(i) + g.dv.at(i));
  }
  expect_near(dk, wg.dk, 1e-11, what + " dk (sum of blocks)");
  expect_near(dv, wg.dv, 1e-11, what + " dv (sum of blocks)");
}

TEST(FlashAttentionCp, QueryBlocksMatchTheWholeSequence) {
  expect_blocks_match(false, 70, 35, false, 0.0, 1);  // two blocks across the 64-key tile edge
  expect_blocks_match(true, 70, 18, true, 0.0, 1);    // uneven blocks, documents
  expect_blocks_match(false, 12, 5, false, 0.3, 1);   // dropout keyed by the global row
  expect_blocks_match(true, 136, 34, true, 0.2, 2);   // the balanced order, cp's four blocks... of two ranks' halves
}

// The balanced order: inputs stored in cp_balanced_order give the natural-order outputs, reordered.
TEST(FlashAttentionCp, TheBalancedOrderIsTheNaturalOrderReordered) {
  for (int64_t c : {2, 3}) {
    const int64_t B = 2, H = 2, T = 12 * 11, D = 4;
    const Shape s{B, H, T, D};
    Tensor q = random_f64(s, 5), k = random_f64(s, 6), v = random_f64(s, 7), w = random_f64(s, 8);
    Tensor doc = documents(B, T);
    const std::vector<int64_t> order = mesh::cp_balanced_order(T, c);
    for (bool docs : {false, true}) {
      Tensor d = docs ? doc : Tensor(), dz = docs ? reorder(doc, 1, order) : Tensor();
      const AttentionOutputs nat = flash_attention(q, k, v, d, args(0.25));
      const AttentionGrads ng = flash_attention_backward(q, k, v, d, nat.out, nat.lse, w, args(0.25));
      Tensor qz = reorder(q, 2, order), kz = reorder(k, 2, order), vz = reorder(v, 2, order), wz = reorder(w, 2, order);
      const AttentionOutputs z = flash_attention(qz, kz, vz, dz, args(0.25, c));
      const std::string what = "cp " + std::to_string(c) + (docs ? " docs" : "");
      expect_near(z.out, reorder(nat.out, 2, order), 1e-12, what + " out");
      expect_near(z.lse, reorder(nat.lse, 2, order), 1e-12, what + " lse");
      const AttentionGrads zg = flash_attention_backward(qz, kz, vz, dz, z.out, z.lse, wz, args(0.25, c));
      expect_near(zg.dq, reorder(ng.dq, 2, order), 1e-12, what + " dq");
      expect_near(zg.dk, reorder(ng.dk, 2, order), 1e-12, what + " dk");
      expect_near(zg.dv, reorder(ng.dv, 2, order), 1e-12, what + " dv");
    }
  }
}

// Visible (query, key) pairs of cp rank r's contiguous block of a sequence of T tokens stored in
// the balanced order over `balanced` ranks (1: the natural order): the attention FLOPs it does.
int64_t visible_pairs(int64_t T, int64_t cp, int64_t r, int64_t balanced) {
  const std::vector<int64_t> pos = mesh::cp_balanced_order(T, balanced);
  int64_t n = 0;
  for (int64_t x = r * T / cp; x < (r + 1) * T / cp; ++x)
    for (int64_t j = 0; j < T; ++j) n += pos[static_cast<size_t>(j)] <= pos[static_cast<size_t>(x)] ? 1 : 0;
  return n;
}

TEST(FlashAttentionCp, TheBalancedOrderGivesEveryRankTheSameAttentionWork) {
  for (int64_t cp : {2, 4, 8}) {
    const int64_t T = 2048;
    std::vector<int64_t> balanced, contiguous;
    for (int64_t r = 0; r < cp; ++r) balanced.push_back(visible_pairs(T, cp, r, cp)), contiguous.push_back(visible_pairs(T, cp, r, 1));
    const auto [bmin, bmax] = std::minmax_element(balanced.begin(), balanced.end());
    EXPECT_LE(static_cast<double>(*bmax), 1.05 * static_cast<double>(*bmin)) << "cp " << cp;
    const auto [cmin, cmax] = std::minmax_element(contiguous.begin(), contiguous.end());
    EXPECT_GT(static_cast<double>(*cmax), 2.0 * static_cast<double>(*cmin)) << "cp " << cp << ": the split it fixes";
    int64_t total = 0;  // every visible pair once: T (T + 1) / 2
    for (int64_t b : balanced) total += b;
    EXPECT_EQ(total, T * (T + 1) / 2);
  }
}

TEST(FlashAttentionCp, BadOrdersAndBlocksAreErrorsNamingTheProblem) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { mesh::cp_balanced_order(10, 2); }).find("does not cut into 2 x cp = 4 equal chunks"),
            std::string::npos);
  EXPECT_NE(message([] { attention_args(Attrs{{"scale", 1.0}, {"balanced_ranks", int64_t{0}}}); }).find("balanced_ranks"),
            std::string::npos);
  Tensor q = random_f64({1, 1, 4, 2}, 1), kv = random_f64({1, 1, 6, 2}, 2);
  AttentionCoords at;
  at.query0 = 3;
  EXPECT_NE(message([&] { flash_attention(q, kv, kv, Tensor(), args(), at); }).find("the local queries [3, 7) and keys [0, 6) do not lie in the sequence of 6"),
            std::string::npos);
}

}  // namespace
}  // namespace shardwise::ops
