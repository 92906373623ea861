// The MoE traffic of `shardwise plan --memory` (train/moe_plan.h): the collectives and bytes of a
// step, against the counts and sizes worked out by hand from the kernel's exchanges.
#include <gtest/gtest.h>

#include "tests/support/llama_config.h"
#include "shardwise/train/moe_plan.h"

namespace shardwise::train {
namespace {

TEST(MoePlan, CountsTheAllToAllsAndTheirBytes) {
  TrainConfig c = llama_test_config("dp=2,ep=2");  // hidden 32, seq 10, batch 8 in 2 micro-batches
  c.model.experts = 4, c.model.top_k = 2;
  c.check(4, false);
  MoeTraffic t = moe_traffic(c);
  // 2 layers x 2 micro-batches; 4 sequences of 10 tokens per micro-batch, 10 on each of 4 ranks.
  EXPECT_EQ(t.moe_layers, 2);
  EXPECT_EQ(t.tokens_per_micro_batch, 40);
  EXPECT_EQ(t.rank_tokens, 10);
  EXPECT_EQ(t.all_to_alls, 16);
  EXPECT_EQ(t.all_gathers, 8);  // one per forward and one per backward: router sums and counts
  // 20 rows each way; f32 rows of 32 (dispatch), 32 (combine), 65 and 33 (backward): 648 bytes.
  EXPECT_DOUBLE_EQ(t.sent_max, 4.0 * 20 * 648);
  EXPECT_DOUBLE_EQ(t.sent_uniform, 4.0 * 20 * 648 / 2);
  EXPECT_EQ(t.received_rows_max, 40);  // all 20 tokens of the ep pair, top-2 of its 2 experts
  c.model.capacity_factor = 0.75;      // C = ceil(0.75 * 40 * 2 / 4) = 15 per expert
  t = moe_traffic(c);
  EXPECT_EQ(t.capacity, 15);
  EXPECT_EQ(t.received_rows_max, 30);
  EXPECT_NE(t.table().find("all_to_all_v x16"), std::string::npos) << t.table();
  EXPECT_NE(t.table().find("16 shared barriers"), std::string::npos) << t.table();
  c.model.moe_layers = {1};
  EXPECT_EQ(moe_traffic(c).all_to_alls, 8);
  // Without an ep dim nothing is exchanged; a dense model has no section.
  c.parallel.mesh = "dp=2";
  t = moe_traffic(c);
  EXPECT_EQ(t.all_to_alls, 0);
  EXPECT_EQ(t.sent_max, 0.0);
  EXPECT_NE(t.table().find("no ep dim"), std::string::npos) << t.table();
  c.model.experts = 0;
  EXPECT_EQ(moe_traffic(c).table(), "");
}

// On cp=2 x ep=2 each rank routes the tokens of its sequence blocks: 4 sequences of 16 tokens per
// micro-batch over 2 ep ranks (2 sequences each), half of each sequence a cp rank: 16 tokens.
TEST(MoePlan, OnCpEachRankRoutesItsBlocksTokens) {
  TrainConfig c = llama_test_config("cp=2,ep=2");
  c.model.experts = 4, c.model.top_k = 2, c.model.seq = 16;
  c.check(4, false);
  const MoeTraffic t = moe_traffic(c);
  EXPECT_EQ(t.tokens_per_micro_batch, 64);
  EXPECT_EQ(t.rank_tokens, 16);
  EXPECT_DOUBLE_EQ(t.sent_max, 4.0 * 32 * 648);  // 16 tokens x top-2 rows, each exchange
  EXPECT_EQ(t.received_rows_max, 64);            // the ep pair's 32 tokens, top-2 of 2 local experts
}

}  // namespace
}  // namespace shardwise::train
