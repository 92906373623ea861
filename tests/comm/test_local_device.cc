// The threads backend on device buffers (comm/device_buffers.h) on the fake device: every
// collective the reshard executor and the trainer use, on 2 to 4 ranks with uneven counts and
// empty shards, gives the host path's bits (bf16 sums of three ranks included: one rounding, as
// on the host); the ranks' streams are ordered by events (each waits for its peers' starts) and
// every event is released; a rank passing host buffers where its peers pass device buffers is an
// Error on every rank naming both. The fake device maps its memory PROT_NONE outside its own copies
// and reductions, so a host memcpy of a device buffer would die here.
#include <gtest/gtest.h>

#include <cstring>

#include <functional>
#include <mutex>
#include <random>
#include <vector>

#include "device_cases.h"
#include "forwarder.h"
#include "shardwise/comm/device_buffers.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/stream_races.h"

namespace shardwise::comm {
namespace {

const Device kFake = Device::cuda(5);

using namespace device_cases;

// Every rank's output of `c` on `n` ranks, with host buffers or device buffers.
std::vector<Tensor> outputs(const Case& c, int n, bool device) {
  std::vector<Tensor> out(static_cast<size_t>(n));
  LocalWorld::run(n, [&](Communicator& comm) {
    out[static_cast<size_t>(comm.rank())] = run_case(comm, c, device ? kFake : Device::host());
  });
  return out;
}

class LocalDevice : public testing::Test {
 protected:
  void SetUp() override { fake_ = &register_fake_device({.index = 5}); }
  void TearDown() override { expect_no_stream_races(*fake_); }
  FakeDeviceMemory* fake_ = nullptr;
};

TEST_F(LocalDevice, EveryCollectiveGivesTheHostPathsBitsOn2To4Ranks) {
  for (const Case& c : cases()) {
    for (int n = 2; n <= 4; ++n) {
      const std::vector<Tensor> host = outputs(c, n, false), device = outputs(c, n, true);
      for (int r = 0; r < n; ++r) {
        const Tensor &h = host[static_cast<size_t>(r)], &d = device[static_cast<size_t>(r)];
        ASSERT_EQ(h.nbytes(), d.nbytes());
        EXPECT_EQ(std::memcmp(h.raw(), d.raw(), h.nbytes()), 0) << c.name << " on " << n << " ranks, rank " << r;
      }
    }
  }
  device_allocator(kFake).release_cached();  // (its own events: blocks a receiving stream used)
  EXPECT_EQ(fake_->live_events(), 0u) << "every event of the calls is released";
}

// Exact values: rank r's bf16 element i is (r + 1) * 2^-8 + (i == 0): three ranks' sums round once.
// The base class's all_to_all_pieces (NCCL's: pack, all_to_all_v, unpack; here under a
// forwarder to the threads backend) on device buffers packs and unpacks with the device's copies:
// the host path's bits (before, a host memcpy of device memory).
TEST_F(LocalDevice, TheDefaultAllToAllPiecesPacksOnTheDevice) {
  const Case c = pieces_case();
  for (int n = 2; n <= 4; ++n) {
    std::vector<Tensor> host(static_cast<size_t>(n)), device(static_cast<size_t>(n));
    LocalWorld::run(n, [&](Communicator& comm) {
      Forwarder plain(comm);
      const auto r = static_cast<size_t>(comm.rank());
      host[r] = run_case(plain, c, Device::host());
      device[r] = run_case(plain, c, kFake);
    });
    for (int r = 0; r < n; ++r) {
      const Tensor &h = host[static_cast<size_t>(r)], &d = device[static_cast<size_t>(r)];
      ASSERT_EQ(h.nbytes(), d.nbytes());
      EXPECT_GT(h.numel(), 0);
      EXPECT_EQ(std::memcmp(h.raw(), d.raw(), h.nbytes()), 0) << n << " ranks, rank " << r;
    }
  }
}

TEST_F(LocalDevice, AllReduceOfBf16SumsInFloatAndRoundsOnce) {
  LocalWorld::run(3, [&](Communicator& c) {
    const Tensor in = to_device(Tensor::from<double>(Shape{2}, {1.0, (c.rank() + 1) / 256.0}).to(DType::BF16), kFake);
    Tensor out = empty_on(DType::BF16, Shape{2}, kFake);
    {
      DeviceBuffers scope(kFake, {});
      c.all_reduce(in.device_ptr(), out.device_ptr(), 2, DType::BF16, Reduce::Sum);
    }
    const Tensor got = to_host(out);
    EXPECT_EQ(got.at(0), 3.0);
    EXPECT_EQ(got.at(1), 6.0 / 256);
  });
}

// Each rank's stream waits for the other's start before it reads the other's buffer.
TEST_F(LocalDevice, EachRanksStreamWaitsForItsPeersEvents) {
  std::vector<Stream> streams(2);
  fake_->clear_stream_log();
  LocalWorld::run(2, [&](Communicator& c) {
    const Stream s = fake_->create_stream();
    streams[static_cast<size_t>(c.rank())] = s;
    Tensor buf = zeros_on(DType::F32, Shape{4}, kFake, s);
    DeviceBuffers scope(kFake, s);
    c.all_gather(buf.device_ptr(), empty_on(DType::F32, Shape{8}, kFake, s).device_ptr(), 4, DType::F32);
  });
  std::map<uint64_t, void*> recorded_on;
  std::vector<std::pair<void*, uint64_t>> waits;
  for (const auto& e : fake_->stream_log()) {
    if (e.kind == FakeDeviceMemory::StreamEvent::Kind::Record) recorded_on[e.event] = e.stream;
    if (e.kind == FakeDeviceMemory::StreamEvent::Kind::Wait) waits.emplace_back(e.stream, e.event);
  }
  for (int r = 0; r < 2; ++r) {
    int on_peer = 0;
    for (auto [stream, event] : waits) on_peer += stream == streams[r].handle && recorded_on[event] == streams[1 - r].handle;
    EXPECT_EQ(on_peer, 2) << "rank " << r << ": the peer's start and its end";
  }
  EXPECT_EQ(fake_->live_events(), 0u);
}

TEST_F(LocalDevice, DeviceBuffersOnOneRankAndHostBuffersOnAnotherAreAnErrorNamingBoth) {
  std::mutex mu;
  std::vector<std::string> errors;
  try {
    LocalWorld::run(2, [&](Communicator& c) {
      Tensor in = zeros_on(DType::F32, Shape{3}, kFake), out = zeros_on(DType::F32, Shape{3}, kFake);
      float host[3] = {}, host_out[3] = {};
      try {
        if (c.rank() == 1) {
          DeviceBuffers scope(kFake, {});
          c.all_reduce(in.device_ptr(), out.device_ptr(), 3, DType::F32, Reduce::Sum);
        } else {
          c.all_reduce(host, host_out, 3, DType::F32, Reduce::Sum);
        }
      } catch (const Error& e) {
        std::lock_guard lock(mu);
        errors.push_back(e.what());
      }
    });
  } catch (const Error&) {
  }
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("rank 0 passes host buffers and rank 1 device buffers of cuda:5"), std::string::npos) << e;
  }
}

TEST_F(LocalDevice, ASendOfHostBytesToADeviceReceiveIsAnErrorOnBothRanks) {
  std::mutex mu;
  std::vector<std::string> errors;
  LocalWorld::run(2, [&](Communicator& c) {
    Tensor buf = zeros_on(DType::F32, Shape{3}, kFake);
    float host[3] = {};
    try {
      if (c.rank() == 0) {
        DeviceBuffers scope(kFake, {});
        auto r = c.start_recv(buf.device_ptr(), 3, DType::F32, 1);
        c.barrier();
        r->wait();
      } else {
        c.barrier();
        c.send(host, 3, DType::F32, 0);
      }
    } catch (const Error& e) {
      std::lock_guard lock(mu);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) EXPECT_NE(e.find("host buffers"), std::string::npos) << e;
}

}  // namespace
}  // namespace shardwise::comm
