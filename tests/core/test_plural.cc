#include <gtest/gtest.h>

#include "shardwise/core/plural.h"

namespace shardwise {
namespace {

TEST(Plural, OneTakesTheSingularEveryOtherCountThePlural) {
  EXPECT_EQ(counted(1, "rank"), "1 rank");
  EXPECT_EQ(counted(0, "rank"), "0 ranks");
  EXPECT_EQ(counted(2, "rank"), "2 ranks");
  EXPECT_EQ(counted(1, "micro-batch"), "1 micro-batch");
  EXPECT_EQ(counted(4, "micro-batch"), "4 micro-batches");
  EXPECT_EQ(counted(3, "process"), "3 processes");
  EXPECT_EQ(counted(2, "index", "indices"), "2 indices");
  EXPECT_EQ(counted(1, "index", "indices"), "1 index");
  EXPECT_EQ(plural_noun(7, "step"), "steps");
  EXPECT_EQ(plural_noun(1, "step"), "step");
}

}  // namespace
}  // namespace shardwise
