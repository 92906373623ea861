// `--profile` sees ring attention's transfers (ops/attention/ring.h): through a
// ProfiledCommunicator every started send and receive is a `start_send` / `start_recv` event with
// the block's bytes and a `wait_send` / `wait_recv` event for its wait, and the results are those
// of the unprofiled ring.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "shardwise/comm/local.h"
#include "shardwise/ops/attention/ring.h"
#include "shardwise/runtime/profiled_comm.h"
#include "shardwise/runtime/profiler.h"

namespace shardwise::runtime {
namespace {

TEST(ProfiledRing, TheRingsTransfersAreStartAndWaitEventsWithTheirBytes) {
  const int n = 3;
  const int64_t rows = 5, D = 4, H = 2;  // one sequence, 2 heads: a block is 2 * 5 * 4 f32 = 160 bytes
  comm::LocalWorld::run(n, [&](comm::Communicator& world) {
    Tensor q = Tensor::full(DType::F32, Shape{1, H, rows, D}, 0.1 * (world.rank() + 1));
    Tensor k = Tensor::full(DType::F32, Shape{1, H, rows, D}, 0.2), v = Tensor::full(DType::F32, Shape{1, H, rows, D}, 0.3);
    ops::AttentionArgs a;
    a.scale = 0.5;
    ops::AttentionCoords at;
    at.query0 = rows * world.rank(), at.seq = rows * n;
    const ops::AttentionOutputs plain = ops::ring_attention(q, k, v, Tensor(), a, at, &world);
    RankProfile profile(world.rank());
    ProfiledCommunicator profiled(world.group(world.members()));
    ops::AttentionOutputs seen;
    {
      ActiveProfile active(&profile);
      seen = ops::ring_attention(q, k, v, Tensor(), a, at, &profiled);
      ops::ring_attention_backward(q, k, v, Tensor(), seen.out, seen.lse, q, a, at, &profiled);
    }
    for (int64_t i = 0; i < plain.out.numel(); ++i) ASSERT_EQ(seen.out.at(i), plain.out.at(i)) << i;
    const std::map<std::string, TypeTotal> totals = profile.totals();
    // Forward: k and v at n - 1 steps; backward: k, v at n - 1 steps and dk, dv at n steps.
    const int64_t transfers = 2 * (n - 1) + 2 * (n - 1) + 2 * n, block = H * rows * D * 4;
    for (const char* name : {"collective start_send", "collective start_recv", "collective wait_send",
                             "collective wait_recv"}) {
      ASSERT_TRUE(totals.count(name)) << name;
      EXPECT_EQ(totals.at(name).count, transfers) << name;
      EXPECT_EQ(totals.at(name).bytes, transfers * block) << name;
    }
    EXPECT_FALSE(totals.count("collective send"));
    EXPECT_FALSE(totals.count("collective recv"));
  });
}

}  // namespace
}  // namespace shardwise::runtime
