// Ring attention (ring.h) on rings of 2, 3 and 4 thread ranks against the whole-sequence kernel:
// each rank holds a block of q, k, v (chunk semantics: uneven and empty blocks too) and gets its
// rows of out, lse and dq and its block of dk, dv; across the 64-key tile edge, with grouped heads,
// packed documents, dropout and cp's balanced order. (The verifier proves the op's rule on
// simulated meshes: tests/verify/test_every_rule.cc.)
#include <gtest/gtest.h>

#include <string>

#include "shardwise/comm/local.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/attention/ring.h"
#include "tests/ops/attention/attention_inputs.h"

namespace shardwise::ops {
namespace {

using namespace testing_attention;  // NOLINT: the shared inputs and comparisons

struct Case {
  int ranks;
  bool grouped;
  int64_t T;
  bool docs;
  double p;
  int64_t balanced;
};

void expect_ring_matches(const Case& c) {
  const int64_t B = 2, G = 2, R = 2, D = 3;
  const Shape qs = c.grouped ? Shape{B, G, R, c.T, D} : Shape{B, G, c.T, D}, kvs{B, G, c.T, D};
  const int qd = qs.ndim() - 2;
  Tensor q = random_f64(qs, 11), k = random_f64(kvs, 12), v = random_f64(kvs, 13), w = random_f64(qs, 14);
  Tensor doc = c.docs ? documents(B, c.T) : Tensor();
  AttentionArgs a;
  a.scale = 0.4, a.p = c.p, a.seed = 3, a.stream = 9, a.balanced_ranks = c.balanced;
  const AttentionOutputs whole = flash_attention(q, k, v, doc, a);
  const AttentionGrads wg = flash_attention_backward(q, k, v, doc, whole.out, whole.lse, w, a);
  const std::string what = "ring of " + std::to_string(c.ranks) + ", " + qs.to_string() + (c.docs ? " docs" : "") +
                           (c.p > 0 ? " dropout" : "") + " balanced " + std::to_string(c.balanced);
  comm::LocalWorld::run(c.ranks, [&](comm::Communicator& world) {
    const mesh::Range r = mesh::chunk_range(c.T, c.ranks, world.rank());
    AttentionCoords at;
    at.query0 = r.offset;
    at.seq = c.T;
    Tensor qb = rows(q, qd, r.offset, r.size), kb = rows(k, 2, r.offset, r.size), vb = rows(v, 2, r.offset, r.size);
    const AttentionOutputs o = ring_attention(qb, kb, vb, doc, a, at, &world);
    const std::string mine = what + " rank " + std::to_string(world.rank());
    expect_near(o.out, rows(whole.out, qd, r.offset, r.size), 1e-12, mine + " out");
    expect_near(o.lse, rows(whole.lse, qd, r.offset, r.size), 1e-12, mine + " lse");
    const AttentionGrads g = ring_attention_backward(qb, kb, vb, doc, o.out, o.lse, rows(w, qd, r.offset, r.size), a,
                                                     at, &world);
    expect_near(g.dq, rows(wg.dq, qd, r.offset, r.size), 1e-11, mine + " dq");
    expect_near(g.dk, rows(wg.dk, 2, r.offset, r.size), 1e-11, mine + " dk");
    expect_near(g.dv, rows(wg.dv, 2, r.offset, r.size), 1e-11, mine + " dv");
  });
}

TEST(RingAttention, EveryRankGetsTheWholeSequencesRowsAndGradients) {
  for (const Case& c : {Case{2, false, 70, false, 0.0, 1},    // two blocks across the tile edge
                        Case{3, true, 70, true, 0.0, 1},      // uneven blocks (24, 24, 22), documents
                        Case{4, false, 2, false, 0.0, 1},     // empty blocks
                        Case{3, true, 36, false, 0.25, 3},    // dropout, cp's balanced order
                        Case{4, false, 136, true, 0.0, 4}}) {  // the balanced order with documents
    expect_ring_matches(c);
  }
}

// Without a ring (one rank, or none) the op is flash_attention on the local block.
TEST(RingAttention, WithoutARingItIsFlashAttention) {
  Tensor q = random_f64({1, 2, 9, 3}, 1), k = random_f64({1, 2, 9, 3}, 2), v = random_f64({1, 2, 9, 3}, 3);
  AttentionArgs a;
  a.scale = 0.5;
  expect_near(ring_attention(q, k, v, Tensor(), a, {}, nullptr).out, flash_attention(q, k, v, Tensor(), a).out, 0.0,
              "no ring");
}

}  // namespace
}  // namespace shardwise::ops
