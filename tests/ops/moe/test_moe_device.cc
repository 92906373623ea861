// The MoE kernel on the fake device's memory (MoeShard::moves from the fake device's table,
// ops/fake_device_moe.h) over 4 threads, tokens and experts split unevenly (rank 3 holds neither;
// expert 5 is never chosen; capacity drops rows): every collective the kernel makes is a
// device-buffer call (a comm::DeviceBuffers scope, both buffers fake-device memory), the host
// reads one thing a call (the gathered counts: one counted copy), and forward and backward give
// the host kernel's bits. And the plan a router on a device (CUDA's) makes from the gathered counts
// alone (moe_detail::plan_sizes, sum_blocks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/ops/fake_device_moe.h"
#include "shardwise/ops/fake_host_window.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/ops/moe/routing.h"
#include "tests/comm/forwarder.h"
#include "tests/ops/random_inputs.h"
#include "tests/support/on_fake_device.h"

namespace shardwise::ops {
namespace {

// Each collective call of the kernel: its name, whether a DeviceBuffers scope was on, and whether
// both buffers were fake-device memory.
struct Call {
  std::string name;
  bool scoped = false, device_in = false, device_out = false;
};

class Recorder : public comm::Forwarder {
 public:
  Recorder(comm::Communicator& c, FakeDeviceMemory& fake) : Forwarder(c), c_(c), fake_(fake) {}
  void all_gather(const void* in, void* out, int64_t n, DType t) override {
    note("all_gather", in, out);
    c_.all_gather(in, out, n, t);
  }
  void all_to_all_pieces(const void* in, const comm::Pieces& s, void* out, const comm::Pieces& r, DType t,
                         const comm::FillPieces& fill) override {
    note("all_to_all_pieces", in, out);
    c_.all_to_all_pieces(in, s, out, r, t, fill);
  }
  void all_to_all_v(const void* in, std::span<const int64_t> s, void* out, std::span<const int64_t> r, DType t) override {
    note("all_to_all_v", in, out);
    c_.all_to_all_v(in, s, out, r, t);
  }
  std::vector<Call> calls;

 private:
  void note(const char* name, const void* in, const void* out) {
    calls.push_back({name, comm::DeviceBuffers::current() != nullptr, fake_.owns(in), fake_.owns(out)});
  }
  comm::Communicator& c_;
  FakeDeviceMemory& fake_;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class MoeOnFakeDevice : public OnFakeDevice {};

TEST_F(MoeOnFakeDevice, ExchangesAreDeviceBufferCallsReadingTheCountsOnceACall) {
  auto& fake = dynamic_cast<FakeDeviceMemory&>(device_memory(kFake));
  const int64_t d = 3, f = 2, E = 6, N = 11;
  std::vector<Tensor> in{testing::random_f64({N, d}, 60), testing::random_f64({E, d}, 61),
                         testing::random_f64({E, f, d}, 62), testing::random_f64({E, f, d}, 63),
                         testing::random_f64({E, d, f}, 64)};
  for (int64_t i = 0; i < in[0].numel(); ++i) in[0].set_at(i, std::abs(in[0].at(i)) + 0.1);  // x > 0
  for (int64_t c = 0; c < d; ++c) in[1].set_at(5 * d + c, -10.0);  // expert 5's logit far below the others
  const Tensor dout = testing::random_f64({N, d}, 65);
  const MoeConfig cfg{2, 0.9, true, false};
  const int64_t token_first[5] = {0, 4, 8, 11, 11}, expert_first[5] = {0, 2, 5, 6, 6};
  auto block = [&](size_t r) {
    const int64_t t0 = token_first[r], t1 = token_first[r + 1], e0 = expert_first[r], e1 = expert_first[r + 1];
    auto experts = [&](const Tensor& t) {
      return t.slice(std::vector<int64_t>{e0, 0, 0}, Shape{e1 - e0, t.shape()[1], t.shape()[2]});
    };
    const std::vector<int64_t> at{t0, 0};
    return std::vector<Tensor>{in[0].slice(at, Shape{t1 - t0, d}), in[1], experts(in[2]), experts(in[3]),
                               experts(in[4]), dout.slice(at, Shape{t1 - t0, d})};
  };
  std::vector<Tensor> host[4], dev[4];
  std::vector<Call> calls[4];
  DeviceCopyStats read;
  comm::LocalWorld::run(4, [&](comm::Communicator& world) {
    const auto r = static_cast<size_t>(world.rank());
    std::vector<Tensor> mine = block(r);
    const std::vector<Tensor> x{mine.begin(), mine.begin() + 5};
    MoeShard shard{token_first[r], N, expert_first[r], &world, &world, MoeExchange::Messages};
    const std::vector<Tensor> out = moe_forward(x, cfg, shard);
    const MoeGrads g = moe_backward(x, mine[5], Tensor::scalar<double>(0.5), Tensor(), cfg, shard);
    host[r] = {out[0], out[1], out[4], g.dx, g.dgate, g.dw1, g.dw3, g.dw2};

    std::vector<Tensor> on_device;
    for (const Tensor& t : mine) on_device.push_back(to_device(t, kFake));
    Recorder rec(world, fake);
    world.barrier();
    if (r == 0) reset_device_copy_stats();
    world.barrier();
    {
      HostWindow w(kFake);
      const std::vector<Tensor> v = w.views(on_device);
      const std::unique_ptr<MoeMoves> moves = fake_moe_moves(w);
      const MoeShard on{token_first[r], N, expert_first[r], &rec, &rec, MoeExchange::Auto, moves.get()};
      const std::vector<Tensor> x_dev{v.begin(), v.begin() + 5};
      const std::vector<Tensor> o = moe_forward(x_dev, cfg, on);
      const MoeGrads gd = moe_backward(x_dev, v[5], Tensor::scalar<double>(0.5), Tensor(), cfg, on);
      dev[r] = {o[0], o[1], o[4], gd.dx, gd.dgate, gd.dw1, gd.dw3, gd.dw2};
    }
    world.barrier();
    if (r == 0) read = device_copy_stats();
    calls[r] = rec.calls;
  });
  // Per rank and call: the block sums' all_gather [3 + k E + E + 1 doubles a rank], then the rows'
  // dispatch and combine.
  const int64_t width = 3 + 2 * E + E + 1;
  EXPECT_EQ(read.to_host_copies, 4 * 2);
  EXPECT_EQ(read.to_host_bytes, 4 * 2 * 4 * width * 8);
  EXPECT_EQ(read.to_device_copies, 0);
  for (size_t r = 0; r < 4; ++r) {
    ASSERT_EQ(calls[r].size(), 6u) << "rank " << r;
    for (size_t i = 0; i < 6; ++i) {
      const Call& c = calls[r][i];
      EXPECT_EQ(c.name, i % 3 == 0 ? "all_gather" : "all_to_all_pieces") << "rank " << r << " call " << i;
      EXPECT_TRUE(c.scoped && c.device_in && c.device_out) << "rank " << r << " " << c.name << " on host memory";
    }
    for (size_t i = 0; i < host[r].size(); ++i) EXPECT_TRUE(same_bits(dev[r][i], host[r][i])) << "rank " << r << " output " << i;
  }
}

// The shared-memory exchange is host memory: asked for on a device, an Error naming why.
TEST_F(MoeOnFakeDevice, SharedExchangeOnADeviceIsAnError) {
  std::string message;
  const std::vector<Tensor> in{testing::random_f64({2, 3}, 1), testing::random_f64({2, 3}, 2),
                               testing::random_f64({1, 2, 3}, 3), testing::random_f64({1, 2, 3}, 4),
                               testing::random_f64({1, 3, 2}, 5)};
  std::mutex mu;
  comm::LocalWorld::run(2, [&](comm::Communicator& world) {
    HostWindow w(kFake);
    const std::unique_ptr<MoeMoves> moves = fake_moe_moves(w);
    const int64_t r = world.rank();
    const MoeShard shard{2 * r, 4, r, &world, &world, MoeExchange::Shared, moves.get()};
    try {
      moe_forward(in, MoeConfig{1, 0.0, true, false}, shard);
    } catch (const Error& e) {
      std::lock_guard lock(mu);
      message = e.what();
    }
  });
  EXPECT_NE(message.find("the rows are device memory"), std::string::npos) << message;
}

// A router whose decisions stay on a device (CUDA's over ranks, cuda_ops/moe_ranks.h) plans from
// the gathered counts alone: moe_detail::plan_sizes gives plan_dispatch's sizes on 4 uneven ranks
// (rank 3 with no tokens or experts, an expert never chosen), and sum_blocks the route's global
// sums. Experts held out of rank order are an Error naming the rank (its rows go in expert order).
TEST(MoePlanSizes, TheGatheredCountsGiveTheDispatchPlansSizes) {
  const int64_t d = 3, f = 2, E = 6, N = 11;
  Tensor x = testing::random_f64({N, d}, 70), gate = testing::random_f64({E, d}, 71);
  for (int64_t c = 0; c < d; ++c) gate.set_at(5 * d + c, -10.0);
  const int64_t token_first[5] = {0, 4, 8, 11, 11}, expert_first[5] = {0, 2, 5, 6, 6};
  const MoeConfig cfg{2, 0.0, true, false};
  std::string out_of_order;
  comm::LocalWorld::run(4, [&](comm::Communicator& world) {
    const auto r = static_cast<size_t>(world.rank());
    const Tensor mine = x.slice(std::vector<int64_t>{token_first[r], 0}, Shape{token_first[r + 1] - token_first[r], d});
    const int64_t local = expert_first[r + 1] - expert_first[r];
    const MoeShard shard{token_first[r], N, expert_first[r], &world, &world};
    const moe_detail::Routing full = moe_detail::route(mine, gate, local, cfg, shard);
    const moe_detail::DispatchPlan want = moe_detail::plan_dispatch(full, local, shard);
    moe_detail::Routing counts;  // what a device's router leaves on the host: the gathered rows
    counts.tokens = full.tokens, counts.experts = E, counts.top_k = 2, counts.tokens_total = N;
    counts.block_sums = full.block_sums, counts.blocks = full.blocks;
    moe_detail::sum_blocks(counts);
    EXPECT_EQ(counts.count_total, full.count_total);
    EXPECT_EQ(counts.prob_total, full.prob_total);
    EXPECT_EQ(counts.z_total, full.z_total);
    const moe_detail::DispatchPlan got = moe_detail::plan_sizes(counts, local, shard);
    EXPECT_TRUE(got.order.empty());
    EXPECT_EQ(got.send_rows, want.send_rows) << "rank " << r;
    EXPECT_EQ(got.send_first, want.send_first) << "rank " << r;
    EXPECT_EQ(got.send_expert_rows, want.send_expert_rows) << "rank " << r;
    EXPECT_EQ(got.recv_rows, want.recv_rows) << "rank " << r;
    EXPECT_EQ(got.rows_from, want.rows_from) << "rank " << r;
    EXPECT_EQ(got.expert_rows, want.expert_rows) << "rank " << r;
    // Ranks 0 and 1 swap their expert ranges (rank 0: experts 2-4, rank 1: 0-1; 5 with rank 2).
    const int64_t swapped_first[4] = {2, 0, 5, 6}, swapped_local[4] = {3, 2, 1, 0};
    const MoeShard swapped{token_first[r], N, swapped_first[r], &world, &world};
    moe_detail::Routing other = moe_detail::route(mine, gate, swapped_local[r], cfg, swapped);
    other.expert.clear(), other.kept.clear();
    try {
      moe_detail::plan_sizes(other, swapped_local[r], swapped);
    } catch (const Error& e) {
      if (r == 0) out_of_order = e.what();
    }
  });
  EXPECT_NE(out_of_order.find("rank 0 of the expert group holds experts from 2, not 0"), std::string::npos)
      << out_of_order;
}

}  // namespace
}  // namespace shardwise::ops
