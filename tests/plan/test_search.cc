// plan --auto's enumeration (plan/search.h): each rule removes a candidate it names and keeps the
// same candidate once the offending size is changed, and the count of a small space matches the
// count worked out by hand.
#include <gtest/gtest.h>

#include "shardwise/core/error.h"
#include "shardwise/plan/search.h"

namespace shardwise::plan {
namespace {

// 8 devices, 4 a node; a model every rule can be made to trip on.
SearchSpace space() {
  SearchSpace s;
  s.devices = 8, s.devices_per_node = 4;
  s.layers = 4, s.heads = 8, s.kv_heads = 8, s.hidden = 64, s.mlp_width = 256, s.vocab = 128, s.seq = 32;
  s.global_batch = 16;
  return s;
}

Candidate candidate(int64_t dp, int64_t tp, int64_t pp, int64_t ep = 1) {
  Candidate c;
  c.dp = dp, c.tp = tp, c.pp = pp, c.ep = ep;
  c.micro_batch = 1;
  c.accumulation = 16 / (dp * ep);
  return c;
}

TEST(Search, EachRuleRemovesWhatItNamesAndKeepsTheFixedCandidate) {
  const SearchSpace s = space();
  EXPECT_EQ(rejecting_rule(s, candidate(2, 2, 2)), "");
  {  // tp-heads: 8 heads split over tp=4, their 2 key/value heads do not; over tp=2 both do
    SearchSpace bad = s;
    bad.kv_heads = 2;
    EXPECT_EQ(rejecting_rule(bad, candidate(2, 4, 1)), "tp-heads");
    EXPECT_EQ(rejecting_rule(bad, candidate(2, 2, 2)), "");
    bad.heads = 6, bad.kv_heads = 6;  // and 6 heads over tp=4
    EXPECT_EQ(rejecting_rule(bad, candidate(2, 4, 1)), "tp-heads");
  }
  {  // tp-sizes: a vocabulary of 127 does not shard evenly over tp=2
    SearchSpace bad = s;
    bad.vocab = 127;
    EXPECT_EQ(rejecting_rule(bad, candidate(2, 2, 2)), "tp-sizes");
    EXPECT_EQ(rejecting_rule(bad, candidate(4, 1, 2)), "");
  }
  // tp-node: tp=8 spans two nodes of 4; tp=4 is one node
  EXPECT_EQ(rejecting_rule(s, candidate(1, 8, 1)), "tp-node");
  EXPECT_EQ(rejecting_rule(s, candidate(2, 4, 1)), "");
  // pp-layers: 4 layers do not cut into 8 stages, nor into 4 stages x 2 virtual
  EXPECT_EQ(rejecting_rule(s, candidate(1, 1, 8)), "pp-layers");
  Candidate interleaved = candidate(2, 1, 4);
  interleaved.schedule = "interleaved", interleaved.virtual_stages = 2;
  EXPECT_EQ(rejecting_rule(s, interleaved), "pp-layers");
  interleaved = candidate(4, 1, 2);
  interleaved.schedule = "interleaved", interleaved.virtual_stages = 2;
  EXPECT_EQ(rejecting_rule(s, interleaved), "");
  // Uneven stages are kept, as train cuts them: 3 layers on pp=2 for 1F1B, 5 layers in pp=2 x 2
  // interleaved chunks; 3 layers cannot fill 4 chunks.
  SearchSpace three = s;
  three.layers = 3;
  EXPECT_EQ(rejecting_rule(three, candidate(4, 1, 2)), "");
  interleaved = candidate(4, 1, 2);
  interleaved.schedule = "interleaved", interleaved.virtual_stages = 2;
  EXPECT_EQ(rejecting_rule(three, interleaved), "pp-layers");
  SearchSpace five = s;
  five.layers = 5;
  EXPECT_EQ(rejecting_rule(five, interleaved), "");
  // ep-experts: ep on a dense model; on 4 experts ep=2 is kept, on 3 refused
  EXPECT_EQ(rejecting_rule(s, candidate(2, 2, 1, 2)), "ep-experts");
  SearchSpace moe = s;
  moe.experts = 4;
  EXPECT_EQ(rejecting_rule(moe, candidate(2, 2, 1, 2)), "");
  moe.experts = 3;
  EXPECT_EQ(rejecting_rule(moe, candidate(2, 2, 1, 2)), "ep-experts");
  // sp-tp: sequence parallelism without tp
  Candidate sp = candidate(8, 1, 1);
  sp.sequence_parallel = true;
  EXPECT_EQ(rejecting_rule(s, sp), "sp-tp");
  sp = candidate(4, 2, 1);
  sp.sequence_parallel = true;
  EXPECT_EQ(rejecting_rule(s, sp), "");
  // batch: a micro-batch of 3 does not divide a data rank's 4 sequences; dp=8 x 3 no global batch of 16
  Candidate batch = candidate(4, 2, 1);
  batch.micro_batch = 3;
  EXPECT_EQ(rejecting_rule(s, batch), "batch");
  batch.micro_batch = 4;
  EXPECT_EQ(rejecting_rule(s, batch), "");
  SearchSpace odd = s;
  odd.global_batch = 12;
  EXPECT_EQ(rejecting_rule(odd, candidate(8, 1, 1)), "batch");
  // pp-schedule: without pp only 1f1b; with pp=2 one micro-batch is too few
  Candidate schedule = candidate(4, 2, 1);
  schedule.schedule = "zbh1";
  EXPECT_EQ(rejecting_rule(s, schedule), "pp-schedule");
  schedule = candidate(4, 1, 2);
  schedule.micro_batch = 4;  // 16 / (4 x 4) = 1 micro-batch
  EXPECT_EQ(rejecting_rule(s, schedule), "pp-schedule");
  schedule.micro_batch = 2;
  EXPECT_EQ(rejecting_rule(s, schedule), "");
  // sharding: a stage above 0 with one data rank
  Candidate sharded = candidate(1, 4, 2);
  sharded.sharding_stage = 1;
  EXPECT_EQ(rejecting_rule(s, sharded), "sharding");
  sharded = candidate(2, 2, 2);
  sharded.sharding_stage = 3;
  EXPECT_EQ(rejecting_rule(s, sharded), "");
}

// Worked by hand: 4 devices on one node, 2 layers, global batch 4, schedules 1f1b and zbh1, stages 0
// and 1, no recompute, no sp. The (dp, tp, pp, ep) with product 4: 10; micro-batches 1, 2, 4; so 10
// x 2 x 2 x 3 = 120 combinations. pp=4 (1 mesh: 12) is pp-layers; ep > 1 (4 meshes: 48) is
// ep-experts. Of the other five meshes (each 12):
//   dp=4:      micro-batch 2, 4 batch (8); zbh1 pp-schedule (2); kept 1f1b x stages 0, 1 (2)
//   dp=2,tp=2: micro-batch 4 batch (4); zbh1 pp-schedule (4); kept 1f1b x 2 x 2 (4)
//   tp=4:      zbh1 pp-schedule (6); stage 1 sharding (3); kept 3
//   pp=2,dp=2: micro-batch 4 batch (4); micro-batch 2 leaves 1 micro-batch, pp-schedule (4); kept 4
//   pp=2,tp=2: micro-batch 4 leaves 1 micro-batch, pp-schedule (4); stage 1 sharding (4); kept 4
TEST(Search, EnumerationCountsASmallSpaceAsWorkedByHand) {
  SearchSpace s;
  s.devices = 4, s.devices_per_node = 4;
  s.layers = 2, s.heads = 4, s.kv_heads = 4, s.hidden = 8, s.mlp_width = 32, s.vocab = 16, s.seq = 8;
  s.global_batch = 4;
  s.sharding_stages = {0, 1};
  s.recompute = {"none"};
  s.schedules = {"1f1b", "zbh1"};
  s.sequence_parallel = false, s.context_parallel = false;
  const Enumeration e = enumerate_candidates(s);
  EXPECT_EQ(e.considered, 120);
  EXPECT_EQ(e.kept.size(), 17u);
  const std::map<std::string, int64_t> removed = {{"pp-layers", 12}, {"ep-experts", 48}, {"batch", 16},
                                                  {"pp-schedule", 20}, {"sharding", 7}};
  EXPECT_EQ(e.removed, removed);
  for (const Candidate& c : e.kept) {
    EXPECT_EQ(c.dp * c.tp * c.pp * c.ep, 4) << c.describe();
    EXPECT_EQ(c.micro_batch * c.accumulation * c.dp * c.ep, 4) << c.describe();
  }
}

// Worked by hand with cp: 4 devices on one node, 2 layers, seq 2048, global batch 4, 1f1b, stage 0,
// no recompute, no sp. (dp, tp, pp, ep, cp) with product 4: 15 meshes; micro-batches 1, 2, 4: 45.
// pp=4 is pp-layers (3); ep > 1 (5 meshes) ep-experts (15); cp=4 leaves 512 tokens a rank, cp (3).
// Of the other 8 meshes:
//   dp=4: micro-batch 2, 4 batch (2), kept 1; tp=4: kept 3; dp=2,tp=2 and dp=2,cp=2: micro-batch 4
//   batch (1 each), kept 2 each; pp=2,dp=2: micro-batch 4 batch (1), 2 pp-schedule (1), kept 1;
//   pp=2,tp=2 and pp=2,cp=2: micro-batch 4 pp-schedule (1 each), kept 2 each; cp=2,tp=2: kept 3.
TEST(Search, EnumerationWithCpCountsAsWorkedByHand) {
  SearchSpace s;
  s.devices = 4, s.devices_per_node = 4;
  s.layers = 2, s.heads = 4, s.kv_heads = 4, s.hidden = 8, s.mlp_width = 32, s.vocab = 16, s.seq = 2048;
  s.global_batch = 4;
  s.sharding_stages = {0};
  s.recompute = {"none"};
  s.schedules = {"1f1b"};
  s.sequence_parallel = false;
  const Enumeration e = enumerate_candidates(s);
  EXPECT_EQ(e.considered, 45);
  EXPECT_EQ(e.kept.size(), 16u);
  const std::map<std::string, int64_t> removed = {{"pp-layers", 3}, {"ep-experts", 15}, {"cp", 3},
                                                  {"batch", 5}, {"pp-schedule", 3}};
  EXPECT_EQ(e.removed, removed);
  int with_cp = 0;
  for (const Candidate& c : e.kept) {
    EXPECT_EQ(c.dp * c.tp * c.pp * c.ep * c.cp, 4) << c.describe();
    with_cp += c.cp == 2;
  }
  EXPECT_EQ(with_cp, 2 + 2 + 3);
}

TEST(Search, TheCpRuleNamesWhatTrainCannotRun) {
  SearchSpace s = space();
  s.seq = 4096;
  Candidate c = candidate(2, 2, 1);
  c.cp = 2;
  EXPECT_EQ(rejecting_rule(s, c), "");
  s.seq = 2050;  // not 2 x cp equal chunks
  EXPECT_EQ(rejecting_rule(s, c), "cp");
  s.seq = 3072;  // 768 tokens a rank on cp=4, under kMinCpTokens
  c = candidate(2, 1, 1), c.cp = 4;
  EXPECT_EQ(rejecting_rule(s, c), "cp");
  s.seq = 4096;
  EXPECT_EQ(rejecting_rule(s, c), "");
  c.sharding_stage = 3;  // train refuses cp with stage 3
  EXPECT_EQ(rejecting_rule(s, c), "cp");
  c.sharding_stage = 0;
  s.experts = 4;  // nor MoE layers
  EXPECT_EQ(rejecting_rule(s, c), "cp");
  // A sharding stage needs two data ranks; cp's count (its ranks sum the gradients).
  s.experts = 0;
  c = candidate(1, 2, 1), c.cp = 4, c.sharding_stage = 1;
  EXPECT_EQ(rejecting_rule(s, c), "");
  EXPECT_EQ(c.mesh(), "cp=4,tp=2");
}

TEST(Search, MeshTextPutsTpInnermostAndRefusesAnEmptySpace) {
  EXPECT_EQ(candidate(2, 2, 2).mesh(), "pp=2,dp=2,tp=2");
  EXPECT_EQ(candidate(1, 1, 1).mesh(), "dp=1");
  EXPECT_EQ(candidate(2, 1, 1, 4).mesh(), "dp=2,ep=4");
  SearchSpace s = space();
  s.devices = 0;
  EXPECT_THROW(enumerate_candidates(s), Error);
}

}  // namespace
}  // namespace shardwise::plan
