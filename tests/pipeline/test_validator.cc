// The validator catches broken schedules, each with a message that names the rank, the action and
// the rule.
#include <gtest/gtest.h>

#include "shardwise/core/error.h"
#include "shardwise/pipeline/validate.h"

namespace shardwise::pipeline {
namespace {

std::string error_of(const Schedule& s) {
  try {
    validate(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "valid";
}

size_t find(const std::vector<Action>& list, ActionKind kind, int mb) {
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == kind && list[i].micro_batch == mb) return i;
  ADD_FAILURE() << "no such action";
  return 0;
}

#define EXPECT_ERROR_HAS(schedule, text)                                              \
  do {                                                                                \
    std::string got = error_of(schedule);                                             \
    EXPECT_NE(got.find(text), std::string::npos) << "expected \"" << text << "\", got: " << got; \
  } while (0)

TEST(Validator, AcceptsEveryGeneratedSchedule) {
  for (int p : {1, 2, 4})
    for (int m : {4, 8}) {
      EXPECT_EQ(error_of(fthenb(p, m)), "valid");
      EXPECT_EQ(error_of(one_f_one_b(p, m)), "valid");
      EXPECT_EQ(error_of(zero_bubble_h1(p, m)), "valid");
      EXPECT_EQ(error_of(interleaved_1f1b(p, 2, m)), "valid");
    }
}

TEST(Validator, BackwardBeforeForward) {
  Schedule s = fthenb(1, 2);
  std::swap(s.actions[0][0], s.actions[0][2]);  // B0 F1 F0 B1
  EXPECT_ERROR_HAS(s, "rank 0, action 0 (B0.s0): backward before the forward of the same micro-batch");
}

TEST(Validator, WeightGradientBeforeInputGradient) {
  Schedule s = zero_bubble_h1(1, 2);  // F0 Bi0 W0 F1 Bi1 W1 step
  auto& l = s.actions[0];
  std::swap(l[find(l, ActionKind::BackwardInput, 1)], l[find(l, ActionKind::BackwardWeight, 1)]);
  EXPECT_ERROR_HAS(s, "weight gradient before the input gradient of the same micro-batch");
}

TEST(Validator, MicroBatchMissingOrTwice) {
  Schedule missing = one_f_one_b(1, 3);
  auto& l = missing.actions[0];
  l.erase(l.begin() + static_cast<long>(find(l, ActionKind::Backward, 2)));
  EXPECT_ERROR_HAS(missing, "micro-batch 2 has no backward on stage 0");
  Schedule twice = one_f_one_b(1, 3);
  twice.actions[0].insert(twice.actions[0].begin() + 1, twice.actions[0][0]);
  EXPECT_ERROR_HAS(twice, "micro-batch 0 already had this action on stage 0");
}

TEST(Validator, SendWithoutReceiveAndReceiveWithoutSend) {
  Schedule s = one_f_one_b(2, 2);
  auto& r1 = s.actions[1];
  r1.erase(r1.begin() + static_cast<long>(find(r1, ActionKind::RecvActivation, 1)));
  // Rank 1's forward of micro-batch 1 has no input now: caught before the matching check.
  EXPECT_ERROR_HAS(s, "rank 1, action");
  EXPECT_ERROR_HAS(s, "is neither computed nor received before");

  Schedule t = one_f_one_b(2, 2);
  auto& r0 = t.actions[0];
  r0.erase(r0.begin() + static_cast<long>(find(r0, ActionKind::SendActivation, 1)));
  EXPECT_ERROR_HAS(t, "rank 1 waits for recvA1.s1<0 but rank 0 never sends it");

  Schedule u = one_f_one_b(2, 2);
  auto& g = u.actions[0];
  g.erase(g.begin() + static_cast<long>(find(g, ActionKind::RecvGrad, 0)));
  g.insert(g.end() - 1, Action{ActionKind::RecvGrad, 0, 0, 1});  // after the backward that needs it
  EXPECT_ERROR_HAS(u, "rank 0, action");
  EXPECT_ERROR_HAS(u, "its output gradient (from stage 1) is neither computed nor received before");
}

TEST(Validator, DeadlockUnderBlockingPointToPoint) {
  // 1F1B on 2 ranks with each receive right before its use and each send right after its
  // producer: rank 0 sends micro-batch 1's activation while rank 1 sends micro-batch 0's gradient;
  // with blocking sends both wait forever.
  Schedule s;
  s.name = "naive-1f1b";
  s.ranks = 2, s.micro_batches = 2;
  using K = ActionKind;
  s.actions = {
      {{K::Forward, 0, 0, -1}, {K::SendActivation, 0, 0, 1}, {K::Forward, 0, 1, -1}, {K::SendActivation, 0, 1, 1},
       {K::RecvGrad, 0, 0, 1}, {K::Backward, 0, 0, -1}, {K::RecvGrad, 0, 1, 1}, {K::Backward, 0, 1, -1},
       {K::OptimizerStep, -1, -1, -1}},
      {{K::RecvActivation, 1, 0, 0}, {K::Forward, 1, 0, -1}, {K::Backward, 1, 0, -1}, {K::SendGrad, 1, 0, 0},
       {K::RecvActivation, 1, 1, 0}, {K::Forward, 1, 1, -1}, {K::Backward, 1, 1, -1}, {K::SendGrad, 1, 1, 0},
       {K::OptimizerStep, -1, -1, -1}},
  };
  EXPECT_ERROR_HAS(s, "deadlocks under blocking point-to-point: rank 0 at sendA1.s0>1, rank 1 at sendG0.s1>0");
  // Receiving micro-batch 1's activation before sending micro-batch 0's gradient fixes it.
  std::swap(s.actions[1][3], s.actions[1][4]);
  EXPECT_EQ(error_of(s), "valid");
}

TEST(Validator, WrongRankPeerAndStepPlacement) {
  Schedule s = one_f_one_b(2, 2);
  s.actions[0][0].stage = 1;
  EXPECT_ERROR_HAS(s, "stage 1 does not run on rank 0");
  Schedule t = one_f_one_b(2, 2);
  for (Action& a : t.actions[0])
    if (a.kind == ActionKind::SendActivation) a.peer = 0;
  EXPECT_ERROR_HAS(t, "stage 1 is on rank 1, not 0");
  Schedule u = one_f_one_b(2, 2);
  std::rotate(u.actions[1].rbegin(), u.actions[1].rbegin() + 1, u.actions[1].rend());  // step first
  EXPECT_ERROR_HAS(u, "the optimizer step must be the last action");
  Schedule v = one_f_one_b(2, 2);
  v.actions[1][1].kind = ActionKind::BackwardInput;
  EXPECT_ERROR_HAS(v, "this schedule does not split the backward");
}

}  // namespace
}  // namespace shardwise::pipeline
