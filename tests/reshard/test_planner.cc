#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/reshard/executor.h"

namespace shardwise::reshard {
namespace {

using Strategy = PlanOptions::Strategy;

Plan plan(const Shape& shape, std::string_view from, std::string_view to, Strategy s = Strategy::Collectives,
          CostModel cost = {}) {
  PlanOptions o;
  o.strategy = s;
  return plan_reshard(shape, DType::F32, parse_layout(from), parse_layout(to), cost, o);
}

// "all_gather,local_slice": the kinds of the plan's steps.
std::string kinds(const Plan& p) {
  std::string out;
  for (const Step& s : p.steps) out += (out.empty() ? "" : ",") + std::string(step_kind_name(s.kind));
  return out;
}

TEST(Planner, OneDimMeshUsesTheTextbookCollective) {
  Shape s{8, 4};
  EXPECT_EQ(kinds(plan(s, "mesh=4 S(0)", "mesh=4 R")), "all_gather");
  EXPECT_EQ(kinds(plan(s, "mesh=4 R", "mesh=4 S(1)")), "local_slice");
  EXPECT_EQ(kinds(plan(s, "mesh=4 P(sum)", "mesh=4 R")), "all_reduce");
  EXPECT_EQ(kinds(plan(s, "mesh=4 P(max)", "mesh=4 S(1)")), "reduce_scatter");
  EXPECT_EQ(kinds(plan(s, "mesh=4 S(0)", "mesh=4 S(1)")), "all_to_all");
  EXPECT_EQ(kinds(plan(s, "mesh=4 R", "mesh=4 P(sum)")), "partialize");
  EXPECT_EQ(kinds(plan(s, "mesh=4 P(sum)", "mesh=4 P(max)")), "all_reduce,partialize");
  EXPECT_EQ(kinds(plan(s, "mesh=4 S(0)", "mesh=4 S(0)")), "");
}

TEST(Planner, BusBandwidthCostsOfACollective) {
  // all_gather of a 8x4 f32 tensor over 4 ranks: (k-1) alphas + (k-1)/k of the 128 gathered bytes.
  CostModel cost;
  cost.alpha_s = 1e-6;
  cost.bandwidth_Bps = 1e9;
  Plan p = plan(Shape{8, 4}, "mesh=4 S(0)", "mesh=4 R", Strategy::Collectives, cost);
  EXPECT_EQ(p.steps[0].bytes, 96);
  EXPECT_DOUBLE_EQ(p.cost_s, 3e-6 + 96 / 1e9);
  // all_reduce of the whole 128 bytes: 2(k-1) alphas, 2(k-1)/k of the buffer.
  p = plan(Shape{8, 4}, "mesh=4 P(sum)", "mesh=4 R", Strategy::Collectives, cost);
  EXPECT_DOUBLE_EQ(p.cost_s, 6e-6 + 192 / 1e9);
}

TEST(Planner, PartialToShardOnA2DMeshIsReduceScatterThenAllGather) {
  // The README's example: a row-parallel output (P on tp) becomes column-sharded, replicated on dp.
  Plan p = plan(Shape{1024, 4096}, "mesh=2x2 S(0),P", "mesh=2x2 R,S(1)");
  EXPECT_EQ(kinds(p), "reduce_scatter,all_gather");
  EXPECT_EQ(p.steps[0].mesh_dim, 1);
  EXPECT_EQ(p.steps[0].after.dist.to_string(), "S(0),S(1)");
  EXPECT_NE(p.to_string().find("reduce_scatter(sum) along mesh dim 1 onto tensor dim 1"), std::string::npos)
      << p.to_string();
}

TEST(Planner, PartialsAreReducedLastMeshDimFirstAndOnlyWhereTheyCommute) {
  // Keeping P(sum) on dim 0 while reducing the later P(max) is fine (the last dim reduces first).
  EXPECT_EQ(kinds(plan(Shape{4, 4}, "mesh=2x2 P(sum),P(max)", "mesh=2x2 P(sum),R")), "all_reduce");
  // Reducing P(max) on dim 0 needs the later P(sum) reduced first: sum and max do not commute.
  Plan p = plan(Shape{4, 4}, "mesh=2x2 P(max),P(sum)", "mesh=2x2 R,P(sum)");
  EXPECT_EQ(kinds(p), "all_reduce,all_reduce,partialize");
  EXPECT_EQ(p.steps[0].mesh_dim, 1);
  // sum and avg commute: P(avg) on dim 0 is reduced while P(sum) on dim 1 stays.
  EXPECT_EQ(kinds(plan(Shape{4, 4}, "mesh=2x2 P(avg),P(sum)", "mesh=2x2 R,P(sum)")), "all_reduce");
}

TEST(Planner, CoShardingOrdersAndAllToAllBetweenTensorDims) {
  // One tensor dim over both mesh dims, in the other order: unshard the inner dim, then the outer.
  EXPECT_EQ(kinds(plan(Shape{8, 8}, "mesh=2x2 S(0),S(0)", "mesh=2x2 S(0)@1,S(0)@0")),
            "all_gather,all_gather,local_slice");
  // The redistribute strategy moves the blocks in one all_to_all_v.
  EXPECT_EQ(kinds(plan(Shape{8, 8}, "mesh=2x2 S(0),S(0)", "mesh=2x2 S(0)@1,S(0)@0", Strategy::Redistribute)),
            "redistribute");
  // Swapping which mesh dim shards which tensor dim is a cycle: one all_gather breaks it, then one
  // all_to_all moves the other mesh dim across.
  EXPECT_EQ(kinds(plan(Shape{8, 8}, "mesh=2x2 S(0),S(1)", "mesh=2x2 S(1),S(0)")), "all_gather,all_to_all,local_slice");
}

TEST(Planner, AutoPicksTheCheaperStrategy) {
  for (auto [from, to] : std::vector<std::pair<const char*, const char*>>{
           {"mesh=2x2 S(0),S(0)", "mesh=2x2 S(0)@1,S(0)@0"},
           {"mesh=2x3 S(0),S(1)", "mesh=2x3 S(1),S(0)"},
           {"mesh=2x2 S(0),P", "mesh=2x2 R,S(1)"},
           {"mesh=2x3 P(sum),S(0)", "mesh=2x3 S(1),R"}}) {
    Plan a = plan(Shape{64, 48}, from, to, Strategy::Auto), c = plan(Shape{64, 48}, from, to, Strategy::Collectives),
         r = plan(Shape{64, 48}, from, to, Strategy::Redistribute);
    EXPECT_DOUBLE_EQ(a.cost_s, std::min(c.cost_s, r.cost_s)) << from << " -> " << to;
  }
  // Each strategy's cost worked out by hand (alpha per message round, bytes over the bandwidth), so
  // that a wrong cost formula, not only a wrong comparison, picks the wrong plan. 64x48 f32 as
  // S(0),S(0) on 2x2: 16-row blocks of 3072 bytes; to S(0)@1,S(0)@0 ranks (0,1) and (1,0) swap.
  // Collectives: all_gather on mesh dim 1 (half of 6144 bytes), then on dim 0 (half of 12288 bytes).
  // Redistribute: one all_to_all_v over the 4 ranks (3 alphas), the busiest rank sends 3072 bytes.
  const char *from = "mesh=2x2 S(0),S(0)", *to = "mesh=2x2 S(0)@1,S(0)@0";
  CostModel fast;  // alpha 5 us, 10 GB/s on both mesh dims
  const double gathers = (5e-6 + 3072 / 10e9) + (5e-6 + 6144 / 10e9), swap = 3 * 5e-6 + 3072 / 10e9;
  Plan a = plan(Shape{64, 48}, from, to, Strategy::Auto, fast);
  EXPECT_DOUBLE_EQ(plan(Shape{64, 48}, from, to, Strategy::Redistribute, fast).cost_s, swap);
  EXPECT_DOUBLE_EQ(a.cost_s, gathers);  // two alphas beat three
  EXPECT_EQ(kinds(a), "all_gather,all_gather,local_slice");
  // Without latency the swap's 3072 bytes beat the gathers' 9216.
  CostModel no_alpha;
  no_alpha.alpha_s = 0;
  a = plan(Shape{64, 48}, from, to, Strategy::Auto, no_alpha);
  EXPECT_DOUBLE_EQ(a.cost_s, 3072 / 10e9);
  EXPECT_EQ(kinds(a), "redistribute");
  // A slow mesh dim 1 (1 MB/s): both plans cross it with 3072 bytes, the gathers with one alpha
  // fewer, so the gathers still win.
  CostModel slow;
  slow.dim_bandwidth_Bps = {0, 1e6};
  a = plan(Shape{64, 48}, from, to, Strategy::Auto, slow);
  EXPECT_DOUBLE_EQ(plan(Shape{64, 48}, from, to, Strategy::Redistribute, slow).cost_s, 3 * 5e-6 + 3072 / 1e6);
  EXPECT_DOUBLE_EQ(a.cost_s, (5e-6 + 3072 / 1e6) + (5e-6 + 6144 / 10e9));
  EXPECT_EQ(kinds(a), "all_gather,all_gather,local_slice");
}

TEST(Planner, BetweenMeshesSendsPointToPoint) {
  Plan p = plan(Shape{8, 4}, "mesh=2 ranks=0,1 S(0)", "mesh=2 ranks=2,3 S(0)");
  EXPECT_EQ(kinds(p), "send_recv");
  EXPECT_EQ(p.steps[0].bytes, 64);  // each stage rank moves its 4x4 f32 block
  // Partial sources keep their parts when both sides have the same shape and placements...
  EXPECT_EQ(kinds(plan(Shape{8, 4}, "mesh=2 ranks=0,1 P(sum)", "mesh=2 ranks=2,3 P(sum)")), "send_recv");
  // ... and are reduced on the source mesh otherwise.
  EXPECT_EQ(kinds(plan(Shape{8, 4}, "mesh=2 ranks=0,1 P(sum)", "mesh=4 ranks=2-5 S(1)")),
            "all_reduce,send_recv");
  EXPECT_EQ(kinds(plan(Shape{8, 4}, "mesh=2 ranks=0,1 R", "mesh=2 ranks=2,3 P(sum)")), "send_recv,partialize");
}

TEST(Planner, LayoutsParseAndBadOnesAreErrors) {
  Layout l = parse_layout("mesh=2x2 ranks=4-7 R,S(1)");
  EXPECT_EQ(l.mesh.process_ids(), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(l.to_string(), "mesh=[2,2] ranks=4,5,6,7 R,S(1)");
  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message([] { parse_layout("S(0)"); }).find("names no mesh"), std::string::npos);
  EXPECT_NE(message([] { parse_layout("mesh=2x2 ranks=1,2 R,R"); }).find("has 4 ranks but 2 are listed"),
            std::string::npos);
  EXPECT_NE(message([] { parse_layout("mesh=2x2 R"); }), "no error");
  std::string m = message([] { plan(Shape{8, 4}, "mesh=2 S(2)", "mesh=2 R"); });
  EXPECT_NE(m.find("source layout"), std::string::npos) << m;
}

TEST(Resharder, AWrongLocalBlockIsAnErrorNamingBothShapes) {
  Plan p = plan(Shape{8, 4}, "mesh=2 S(0)", "mesh=2 R");
  try {
    comm::LocalWorld::run(2, [&](comm::Communicator& c) {
      Resharder r(c.group(c.members()));
      r.run(p, Tensor(DType::F32, Shape{8, 4}));
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds f32 8x4 but its block of f32 8x4 under mesh=[2] S(0) is f32 4x4"),
              std::string::npos)
        << e.what();
  }
}

TEST(Resharder, CountsTheBytesItSends) {
  Plan p = plan(Shape{8, 4}, "mesh=2 S(0)", "mesh=2 S(1)");
  std::vector<int64_t> sent(2);
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    Resharder r(c.group(c.members()));
    r.run(p, Tensor(DType::F32, Shape{4, 4}));
    sent[static_cast<size_t>(c.rank())] = r.bytes_sent();
  });
  EXPECT_EQ(sent, (std::vector<int64_t>{32, 32}));  // a 4x2 f32 block to the other rank
}

TEST(Resharder, MovesAStorageOnlyTensorsBytesAndRefusesToReduceIt) {
  // A u64 3x4 tensor of values above 2^53 (a double would round them), S(0) -> S(1) on 2 ranks
  // (uneven rows: 2 and 1); each rank's block equals the global tensor's columns.
  auto value = [](int64_t r, int64_t c) { return ~uint64_t{0} - static_cast<uint64_t>(r * 4 + c); };
  const Layout from = parse_layout("mesh=2 S(0)"), to = parse_layout("mesh=2 S(1)");
  Plan p = plan_reshard(Shape{3, 4}, DType::U64, from, to);
  comm::LocalWorld::run(2, [&](comm::Communicator& c) {
    const int64_t r0 = c.rank() == 0 ? 0 : 2, rows = c.rank() == 0 ? 2 : 1;
    Tensor mine = Tensor::uninitialized(DType::U64, Shape{rows, 4});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < 4; ++k) mine.data<uint64_t>()[r * 4 + k] = value(r0 + r, k);
    Resharder rs(c.group(c.members()));
    Tensor out = rs.run(p, mine);
    ASSERT_EQ(out.shape(), (Shape{3, 2}));
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t k = 0; k < 2; ++k) EXPECT_EQ(out.data<uint64_t>()[r * 2 + k], value(r, c.rank() * 2 + k));
  });
  std::string msg;
  try {
    plan_reshard(Shape{2}, DType::U32, parse_layout("mesh=2 P(sum)"), parse_layout("mesh=2 R"));
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("reduces a Partial: dtype u32 is storage-only"), std::string::npos) << msg;
  EXPECT_NO_THROW(plan_reshard(Shape{2}, DType::U32, parse_layout("mesh=2 P(sum)"), parse_layout("mesh=2 P(sum)")));
}

}  // namespace
}  // namespace shardwise::reshard
