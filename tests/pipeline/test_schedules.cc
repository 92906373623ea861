// The generated schedules are valid and their simulated bubbles and peak activations equal the
// published closed forms: (p-1)/(m+p-1) for FThenB and 1F1B, (p-1)/(v m+p-1) for interleaved 1F1B,
// and ZB-H1's idle time one third of 1F1B's when forward, input gradient and weight gradient take
// the same time.
#include <gtest/gtest.h>

#include "shardwise/core/error.h"
#include "shardwise/pipeline/simulate.h"
#include "shardwise/pipeline/validate.h"

namespace shardwise::pipeline {
namespace {

SimOptions times(double f, double b, double bi = 1, double w = 1) {
  SimOptions o;
  o.stages = {StageCosts{f, b, bi, w, 1, 0}};
  return o;
}

int count(const Schedule& s, int rank, ActionKind kind) {
  int n = 0;
  for (const Action& a : s.actions[static_cast<size_t>(rank)]) n += a.kind == kind;
  return n;
}

TEST(Schedules, FThenBAnd1F1BBubbleIsTheClosedForm) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 4, 8, 12}) {
      for (auto [f, b] : {std::pair{1.0, 2.0}, {1.0, 1.0}, {0.5, 1.25}}) {
        for (const Schedule& s : {fthenb(p, m), one_f_one_b(p, m)}) {
          SCOPED_TRACE(fmt::format("{} p={} m={} f={} b={}", s.name, p, m, f, b));
          ASSERT_NO_THROW(validate(s));
          SimResult r = simulate(s, times(f, b));
          const double expected = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
          EXPECT_NEAR(r.step_time, (m + p - 1) * (f + b), 1e-9);
          for (const RankSim& rank : r.ranks) EXPECT_NEAR(rank.bubble_fraction, expected, 1e-12);
        }
      }
    }
  }
}

TEST(Schedules, InterleavedBubbleIsTheClosedForm) {
  for (int p : {2, 3, 4}) {
    for (int v : {2, 3, 4}) {
      for (int m : {p, 2 * p, 3 * p}) {
        SCOPED_TRACE(fmt::format("p={} v={} m={}", p, v, m));
        Schedule s = interleaved_1f1b(p, v, m);
        ASSERT_NO_THROW(validate(s));
        // Each virtual stage holds 1/v of a rank's layers: forward 1/v, backward 2/v.
        SimResult r = simulate(s, times(1.0 / v, 2.0 / v));
        const double expected = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
        for (const RankSim& rank : r.ranks) EXPECT_NEAR(rank.bubble_fraction, expected, 1e-12);
        // Fewer bubbles than plain 1F1B on the same model.
        EXPECT_LT(r.max_bubble_fraction(), simulate(one_f_one_b(p, m), times(1, 2)).max_bubble_fraction());
      }
    }
  }
}

TEST(Schedules, ZeroBubbleH1IdlesOneThirdOf1F1B) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, p + 1, 2 * p, 3 * p + 2}) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      Schedule zb = zero_bubble_h1(p, m);
      ASSERT_NO_THROW(validate(zb));
      SimResult z = simulate(zb, times(1, 2, 1, 1));
      SimResult o = simulate(one_f_one_b(p, m), times(1, 2, 1, 1));  // B = input + weight gradient
      for (int r = 0; r < p; ++r) {
        double zb_idle = z.step_time - z.ranks[static_cast<size_t>(r)].compute;
        double ofob_idle = o.step_time - o.ranks[static_cast<size_t>(r)].compute;
        EXPECT_NEAR(ofob_idle, 3.0 * (p - 1), 1e-9);
        EXPECT_NEAR(zb_idle, ofob_idle / 3.0, 1e-9) << "rank " << r;
        EXPECT_NEAR(z.ranks[static_cast<size_t>(r)].bubble_fraction, (p - 1.0) / (3.0 * m + p - 1.0), 1e-12);
        // No more micro-batches in flight than 1F1B's first rank.
        EXPECT_LE(z.ranks[static_cast<size_t>(r)].peak_micro_batches, p);
      }
    }
  }
}

TEST(Schedules, PeakActivationsFThenBHoldsEveryMicroBatch1F1BAtMostTheStages) {
  for (int p : {2, 4}) {
    for (int m : {2, 4, 8, 16}) {
      SimResult f = simulate(fthenb(p, m), times(1, 2));
      SimResult o = simulate(one_f_one_b(p, m), times(1, 2));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(f.ranks[static_cast<size_t>(r)].peak_micro_batches, m);
        EXPECT_EQ(f.ranks[static_cast<size_t>(r)].peak_bytes, m);
        EXPECT_EQ(o.ranks[static_cast<size_t>(r)].peak_micro_batches, std::min(p - r, m)) << "p=" << p << " m=" << m;
      }
      EXPECT_EQ(o.max_peak_bytes(), std::min(p, m));
    }
  }
  // Bytes per stage: a rank holding two stages adds both.
  SimOptions o;
  o.stages = {StageCosts{1, 2, 1, 1, 100, 0}, StageCosts{1, 2, 1, 1, 10, 0}};
  SimResult one = simulate(fthenb(1, 3), SimOptions{{StageCosts{1, 2, 1, 1, 7, 0}}, 0, {}});
  EXPECT_EQ(one.ranks[0].peak_bytes, 21);
  SimResult two = simulate(fthenb(2, 3), o);
  EXPECT_EQ(two.ranks[0].peak_bytes, 300);
  EXPECT_EQ(two.ranks[1].peak_bytes, 30);
}

TEST(Schedules, SplitBackwardKeepsWeightGradientBytesUntilW) {
  SimOptions o;
  o.stages = {StageCosts{1, 2, 1, 1, 10, 4}};
  SimResult z = simulate(zero_bubble_h1(2, 4), o);
  // Rank 0: F0 F1 Bi0 W0 F2 ...: two forwards held (20). Rank 1: F0 Bi0 F1 Bi1 W0 F2 ...: after
  // F1 it holds micro-batch 1's activations (10) and micro-batch 0's weight-gradient inputs (4).
  EXPECT_EQ(z.ranks[0].peak_bytes, 20);
  EXPECT_EQ(z.ranks[1].peak_bytes, 14);
}

TEST(Schedules, MessagesAreMatchedAndPlacedWithoutDeadlock) {
  Schedule s = one_f_one_b(2, 4);
  // Rank 1 receives micro-batch 1's activation before it sends micro-batch 0's gradient: with the
  // opposite order both ranks would block in their sends.
  const auto& r1 = s.actions[1];
  auto pos = [&](ActionKind k, int mb) {
    for (size_t i = 0; i < r1.size(); ++i)
      if (r1[i].kind == k && r1[i].micro_batch == mb) return i;
    return r1.size();
  };
  EXPECT_LT(pos(ActionKind::RecvActivation, 1), pos(ActionKind::SendGrad, 0)) << s.to_string();
  EXPECT_EQ(count(s, 0, ActionKind::SendActivation), 4);
  EXPECT_EQ(count(s, 1, ActionKind::RecvActivation), 4);
  EXPECT_EQ(count(s, 1, ActionKind::SendGrad), 4);
  EXPECT_EQ(count(s, 0, ActionKind::RecvGrad), 4);
  EXPECT_EQ(s.actions[0].back().kind, ActionKind::OptimizerStep);
  // One rank with two virtual stages: hand-over without messages.
  Schedule local = interleaved_1f1b(1, 2, 3);
  EXPECT_NO_THROW(validate(local));
  EXPECT_EQ(count(local, 0, ActionKind::SendActivation), 0);
}

TEST(Schedules, ImpossibleConfigurationsAreRefusedWithTheNumbers) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { interleaved_1f1b(4, 2, 6); }).find("6 micro-batches are not a multiple of the 4 pipeline ranks"),
            std::string::npos);
  EXPECT_NE(message([] { interleaved_1f1b(4, 1, 8); }).find("at least 2 virtual stages"), std::string::npos);
  EXPECT_NE(message([] { zero_bubble_h1(4, 3); }).find("3 micro-batches for 4 pipeline ranks"), std::string::npos);
  EXPECT_NE(message([] { one_f_one_b(2, 0); }).find("at least 1 micro-batch"), std::string::npos);
  EXPECT_NE(message([] { make_schedule(ScheduleKind::OneFOneB, 2, 4, 2); }).find("needs the interleaved schedule"),
            std::string::npos);
  EXPECT_NE(message([] { parse_schedule_kind("2f2b"); }).find("unknown pipeline schedule '2f2b'"), std::string::npos);
  EXPECT_NE(message([] { split_layers(6, 3, 2); }).find("3 stages do not make 2 virtual stages"), std::string::npos);
  EXPECT_NE(message([] { split_layers(3, 4); }).find("3 layers cannot fill 4 pipeline stages"), std::string::npos);
}

TEST(Schedules, LayersAreBalancedWithExtrasInTheMiddle) {
  auto sizes = [](const std::vector<LayerRange>& r) {
    std::vector<int> out;
    for (auto x : r) out.push_back(x.end - x.begin);
    return out;
  };
  EXPECT_EQ(sizes(split_layers(8, 4)), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(sizes(split_layers(6, 4)), (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(sizes(split_layers(7, 4)), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(sizes(split_layers(3, 2)), (std::vector<int>{2, 1}));
  auto r = split_layers(8, 4, 2);
  EXPECT_EQ(r.back().end, 8);
  EXPECT_EQ(r[1].begin, 2);
  // Interleaved chunks take the same rule: 6 layers in 2 ranks x 2 virtual stages.
  EXPECT_EQ(sizes(split_layers(6, 4, 2)), (std::vector<int>{1, 2, 2, 1}));
}

// Llama 3 405B (arXiv 2407.21783, section 3.3.2): 126 layers on 16 pipeline ranks x 4 virtual
// stages, one layer fewer on the first stage and on the last: 7 layers on rank 0 and rank 15, 8 on
// each other rank.
TEST(Schedules, Llama3sUnevenInterleavedSplitHasFewerLayersOnTheFirstAndLastStage) {
  const std::vector<LayerRange> r = split_layers(126, 64, 4);
  ASSERT_EQ(r.size(), 64u);
  EXPECT_EQ(r.front().begin, 0);
  EXPECT_EQ(r.back().end, 126);
  for (size_t s = 0; s < r.size(); ++s) {
    EXPECT_EQ(r[s].end - r[s].begin, s == 0 || s == 63 ? 1 : 2) << "chunk " << s;
    if (s > 0) { EXPECT_EQ(r[s].begin, r[s - 1].end); }
  }
  const Schedule sched = interleaved_1f1b(16, 4, 16);
  for (int rank = 0; rank < 16; ++rank) {
    int held = 0;
    for (int s : sched.stages_of(rank)) held += r[static_cast<size_t>(s)].end - r[static_cast<size_t>(s)].begin;
    EXPECT_EQ(held, rank == 0 || rank == 15 ? 7 : 8) << "rank " << rank;
  }
}

TEST(Schedules, TimelinePictureHasABoxPerComputeAction) {
  Schedule s = interleaved_1f1b(2, 2, 4);
  SimResult r = simulate(s);
  std::string svg = timeline_svg(s, r);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  size_t boxes = 0;
  for (size_t at = 0; (at = svg.find("<title>", at)) != std::string::npos; ++at) ++boxes;
  EXPECT_EQ(boxes, 2u * 2 * 4 * 2);  // ranks x virtual stages x micro-batches x (F, B)
  EXPECT_NE(svg.find("interleaved"), std::string::npos);
}

}  // namespace
}  // namespace shardwise::pipeline

namespace shardwise::pipeline {
namespace {

TEST(Schedules, ReplayOfActionTimesEqualsTheStageTimes) {
  Schedule s = one_f_one_b(3, 5);
  SimResult planned = simulate(s, times(1.5, 2.5));
  SimOptions replay;
  for (const auto& list : s.actions) {
    replay.durations.emplace_back();
    for (const Action& a : list)
      replay.durations.back().push_back(a.kind == ActionKind::Forward ? 1.5 : a.kind == ActionKind::Backward ? 2.5 : 0);
  }
  SimResult r = simulate(s, replay);
  EXPECT_DOUBLE_EQ(r.step_time, planned.step_time);
  // One slow forward on the first rank delays everyone behind it by the same amount.
  replay.durations[0][0] += 1;
  EXPECT_DOUBLE_EQ(simulate(s, replay).step_time, planned.step_time + 1);
}

}  // namespace
}  // namespace shardwise::pipeline
