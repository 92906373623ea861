#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "collective_checks.h"
#include "forwarder.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

// Rank r contributes value(r, i) = (r + 1) * 10 + i.
double value(int r, int i) { return (r + 1) * 10.0 + i; }

// The Error `fn` raises on `ranks` threads ("no error" if none).
std::string message_of(int ranks, const std::function<void(Communicator&)>& fn) {
  try {
    LocalWorld::run(ranks, fn);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(LocalComm, AllReduceEveryOpOn1To4Ranks) {
  for (int n = 1; n <= 4; ++n) {
    for (Reduce op : {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min, Reduce::Prod}) {
      LocalWorld::run(n, [&](Communicator& c) {
        std::vector<double> in(5), out(5);
        for (int i = 0; i < 5; ++i) in[static_cast<size_t>(i)] = value(c.rank(), i) * (c.rank() % 2 ? -1 : 1);
        c.all_reduce(in.data(), out.data(), 5, DType::F64, op);
        for (int i = 0; i < 5; ++i) {
          double expect = op == Reduce::Prod ? 1.0 : op == Reduce::Max ? -1e300 : op == Reduce::Min ? 1e300 : 0.0;
          for (int r = 0; r < n; ++r) {
            double v = value(r, i) * (r % 2 ? -1 : 1);
            if (op == Reduce::Sum || op == Reduce::Avg) expect += v;
            if (op == Reduce::Prod) expect *= v;
            if (op == Reduce::Max) expect = std::max(expect, v);
            if (op == Reduce::Min) expect = std::min(expect, v);
          }
          if (op == Reduce::Avg) expect /= n;
          ASSERT_DOUBLE_EQ(out[static_cast<size_t>(i)], expect) << "n=" << n << " op=" << reduce_name(op);
        }
      });
    }
  }
}

TEST(LocalComm, EveryOperationOn1To4Ranks) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE(n);
    LocalWorld::run(n, [](Communicator& c) { checks::all(c); });
  }
}

TEST(LocalComm, UnequalAllToAllVCountsAreAnErrorNamingBothCounts) {
  try {
    LocalWorld::run(3, [](Communicator& c) {
      std::vector<int64_t> send = {1, 1, 1}, recv = {1, 1, 1};
      if (c.rank() == 2) recv[0] = 4;  // rank 0 sends 1 element to rank 2, which expects 4
      std::vector<float> in(3), out(6);
      c.all_to_all_v(in.data(), send, out.data(), recv, DType::F32);
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 1 elements to rank 2, but rank 2 expects 4"), std::string::npos)
        << e.what();
  }
}

// The default all_to_all_pieces (pack, all_to_all_v, unpack) that the NCCL backend uses.
TEST(LocalComm, TheDefaultAllToAllPiecesPacksAndUnpacks) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE(n);
    LocalWorld::run(n, [](Communicator& c) {
      Forwarder d(c);
      checks::all_to_all_pieces_scattered(d);
      checks::all_to_all_pieces_filled(d);
    });
  }
}

// Shared regions: none for a backend without them (the base class's default), a wrapper's are
// its carrier's.
TEST(LocalComm, SharedRegionsAreNoneByDefaultAndTheCarriersThroughAWrapper) {
  LocalWorld::run(2, [](Communicator& c) {
    Forwarder plain(c);
    EXPECT_FALSE(plain.shared_regions(64));
    EXPECT_THROW(plain.shared_barrier(), Error);
    struct Wrapper final : Forwarder {
      Wrapper(Communicator& c) : Forwarder(c), inner(&c) {}
      const Communicator* carrier() const override { return inner->carrier(); }
      const Communicator* inner;
    } wrapped(c);
    const SharedRegions direct = c.shared_regions(64), through = wrapped.shared_regions(64);
    ASSERT_TRUE(through);
    EXPECT_EQ(through.at[1], direct.at[1]);
    EXPECT_EQ(through.call, direct.call + 1);
    wrapped.shared_barrier();
  });
}

// A scope names one communicator (through forwarding wrappers: carrier()), in this thread only,
// and nests; the local backend checks its calls even inside one.
TEST(CheckedByCaller, ScopesAreByCommunicatorAndThreadAndNest) {
  struct Wrapper final : Forwarder {
    Wrapper(Communicator& c) : Forwarder(c), inner(&c) {}
    const Communicator* carrier() const override { return inner->carrier(); }
    Communicator* inner;
  };
  LocalWorld::run(2, [](Communicator& c) {
    auto group = c.group(c.members());
    Wrapper wrapped(c);
    EXPECT_FALSE(CheckedByCaller::active(&c));
    {
      CheckedByCaller outer(&wrapped);
      EXPECT_TRUE(CheckedByCaller::active(&c));
      EXPECT_TRUE(CheckedByCaller::active(&wrapped));
      EXPECT_FALSE(CheckedByCaller::active(group.get()));
      EXPECT_FALSE(CheckedByCaller::active(nullptr));
      bool elsewhere = true;
      std::thread([&] { elsewhere = CheckedByCaller::active(&c); }).join();
      EXPECT_FALSE(elsewhere);
      {
        CheckedByCaller inner(group.get());
        CheckedByCaller none(nullptr);
        EXPECT_TRUE(CheckedByCaller::active(group.get()));
        EXPECT_TRUE(CheckedByCaller::active(&c));
      }
      EXPECT_FALSE(CheckedByCaller::active(group.get()));
      EXPECT_TRUE(CheckedByCaller::active(&c));
    }
    EXPECT_FALSE(CheckedByCaller::active(&c));
  });
  const std::string m = message_of(2, [](Communicator& c) {
    CheckedByCaller scope(&c);
    int64_t x = 0;
    if (c.rank() == 0) c.broadcast(&x, 1, DType::I64, 0);
    else c.all_reduce(&x, &x, 1, DType::I64, Reduce::Sum);
  });
  EXPECT_NE(m.find("called broadcast while rank 1 called all_reduce"), std::string::npos) << m;
}

TEST(LocalComm, AllToAllPiecesTotalsAndBadPiecesAreErrors) {
  auto message_of = [](const std::function<void(Communicator&)>& fn) { return comm::message_of(3, fn); };
  // Rank 0 sends 1 element to rank 2 in one piece; rank 2 expects 2 (two pieces of 1).
  EXPECT_NE(message_of([](Communicator& c) {
              std::vector<int64_t> first = {0, 1, 2, 3}, offset = {0, 1, 2}, count = {1, 1, 1};
              std::vector<int64_t> rfirst = first, roffset = offset, rcount = count;
              if (c.rank() == 2) rfirst = {0, 2, 3, 4}, roffset = {0, 1, 2, 3}, rcount = {1, 1, 1, 1};
              std::vector<float> in(3), out(4);
              c.all_to_all_pieces(in.data(), Pieces{first, offset, count}, out.data(), Pieces{rfirst, roffset, rcount},
                                  DType::F32);
            }).find("all_to_all_pieces: rank 0 sends 1 elements to rank 2, but rank 2 expects 2"),
            std::string::npos);
  EXPECT_NE(message_of([](Communicator& c) {
              std::vector<int64_t> first = {0, 0, 0}, none;
              c.all_to_all_pieces(nullptr, Pieces{first, none, none}, nullptr, Pieces{first, none, none}, DType::F32);
            }).find("all_to_all_pieces (send): 3 piece starts given for a group of 3 ranks (want 4"),
            std::string::npos);
  EXPECT_NE(message_of([](Communicator& c) {
              std::vector<int64_t> first = {0, 1, 1, 1}, offset = {0}, count = {-1}, none = {0, 0, 0, 0};
              c.all_to_all_pieces(nullptr, Pieces{none, {}, {}}, nullptr, Pieces{first, offset, count}, DType::F32);
            }).find("all_to_all_pieces (receive): piece 0 of rank 0 has offset 0 and count -1"),
            std::string::npos);
}

TEST(LocalComm, MismatchedOperationsRootsAndMessagesAreErrors) {
  auto message_of = [](const std::function<void(Communicator&)>& fn) { return comm::message_of(2, fn); };
  std::string m = message_of([](Communicator& c) {
    int64_t x = 0;
    if (c.rank() == 0) c.broadcast(&x, 1, DType::I64, 0);
    else c.all_reduce(&x, &x, 1, DType::I64, Reduce::Sum);
  });
  EXPECT_NE(m.find("called broadcast while rank 1 called all_reduce"), std::string::npos) << m;
  m = message_of([](Communicator& c) {
    int64_t x = 0;
    c.broadcast(&x, 1, DType::I64, c.rank());
  });
  EXPECT_NE(m.find("rank 0 uses root 0 but rank 1 uses root 1"), std::string::npos) << m;
  m = message_of([](Communicator& c) {
    std::vector<float> buf(4);
    if (c.rank() == 0) c.send(buf.data(), 4, DType::F32, 1);
    else c.recv(buf.data(), 3, DType::F32, 0);
  });
  EXPECT_NE(m.find("expects 3 elements of f32 (12 bytes) from rank 0 (tag 0), but the message has 16 bytes"),
            std::string::npos) << m;
  m = message_of([](Communicator& c) {
    std::vector<int64_t> counts = {1, 2};
    if (c.rank() == 1) counts = {2, 2};
    std::vector<float> in(2), out(4);
    c.all_gather_v(in.data(), out.data(), counts, DType::F32);
  });
  EXPECT_NE(m.find("rank 0 passes counts [1,2] but rank 1 passes [2,2]"), std::string::npos) << m;
  m = message_of([](Communicator& c) { c.broadcast(nullptr, 0, DType::F32, 5); });
  EXPECT_NE(m.find("root 5 is not a rank of a group of 2"), std::string::npos) << m;
}

TEST(LocalComm, ARankFailingWhileOthersWaitInRecvReleasesThem) {
  try {
    LocalWorld::run(3, [](Communicator& c) {
      float x = 0;
      if (c.rank() == 1) throw Error("rank one broke");
      c.recv(&x, 1, DType::F32, c.rank() == 0 ? 1 : 0);  // nobody ever sends
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed: rank one broke"), std::string::npos) << e.what();
  }
}

TEST(LocalComm, TheFailingRanksErrorKeepsItsKind) {
  // The rank that fails first decides the error and its kind; the ranks it releases do not.
  try {
    LocalWorld::run(3, [](Communicator& c) {
      float x = 0;
      if (c.rank() == 2) throw KindedError(ErrorKind::Data, "rank two read no data");
      c.recv(&x, 1, DType::F32, c.rank() == 0 ? 1 : 0);  // nobody ever sends
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(error_kind(e), ErrorKind::Data) << e.what();
    EXPECT_STREQ(e.what(), "rank 2 failed: rank two read no data");
  }
  try {
    LocalWorld::run(2, [](Communicator& c) {
      if (c.rank() == 1) throw Error("plain");
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(error_kind(e), ErrorKind::General) << e.what();
  }
}

TEST(LocalComm, InPlaceAllReduceAndIntegers) {
  LocalWorld::run(3, [](Communicator& c) {
    Tensor t = Tensor::full(DType::I32, Shape{4}, c.rank() + 1);
    c.all_reduce(t, Reduce::Sum);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(t.at(i), 6);
  });
}

TEST(LocalComm, AllGatherAndBroadcast) {
  for (int n = 1; n <= 4; ++n) {
    LocalWorld::run(n, [n](Communicator& c) {
      std::vector<int64_t> in = {c.rank() * 100, c.rank() * 100 + 1};
      std::vector<int64_t> out(static_cast<size_t>(2 * n));
      c.all_gather(in.data(), out.data(), 2, DType::I64);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(out[static_cast<size_t>(2 * r)], r * 100);
        ASSERT_EQ(out[static_cast<size_t>(2 * r + 1)], r * 100 + 1);
      }
      std::vector<float> b(3, static_cast<float>(c.rank()));
      c.broadcast(b.data(), 3, DType::F32, n - 1);
      for (float v : b) ASSERT_EQ(v, static_cast<float>(n - 1));
      // Zero-size collectives are fine.
      c.all_gather(nullptr, nullptr, 0, DType::F32);
      c.barrier();
    });
  }
}

TEST(LocalComm, MeshSubGroupsReduceAlongOneDim) {
  // Mesh [2,3]: along dim 1 the groups are {0,1,2} and {3,4,5}; along dim 0 {0,3}, {1,4}, {2,5}.
  mesh::ProcessMesh mesh(Shape{2, 3});
  std::vector<std::vector<int64_t>> got(6);
  LocalWorld::run(6, [&](Communicator& world) {
    std::shared_ptr<Communicator> self = world.group(world.members());
    MeshComm mc(mesh, self);
    int64_t mine = int64_t{1} << world.rank();
    int64_t along1 = 0, along0 = 0, both = 0;
    int dim1[] = {1}, dim0[] = {0}, all[] = {0, 1};
    mc.along(dim1).all_reduce(&mine, &along1, 1, DType::I64, Reduce::Sum);
    mc.along(dim0).all_reduce(&mine, &along0, 1, DType::I64, Reduce::Sum);
    mc.along(all).all_reduce(&mine, &both, 1, DType::I64, Reduce::Sum);
    got[static_cast<size_t>(world.rank())] = {along1, along0, both, mc.along(dim1).rank(), mc.along(dim0).size()};
  });
  EXPECT_EQ(got[0], (std::vector<int64_t>{0b000111, 0b001001, 0b111111, 0, 2}));
  EXPECT_EQ(got[4], (std::vector<int64_t>{0b111000, 0b010010, 0b111111, 1, 2}));
  EXPECT_EQ(got[5], (std::vector<int64_t>{0b111000, 0b100100, 0b111111, 2, 2}));
}

TEST(LocalComm, SizeMismatchIsAnErrorNamingBothSizes) {
  try {
    LocalWorld::run(2, [](Communicator& c) {
      std::vector<float> in(8), out(8);
      c.all_reduce(in.data(), out.data(), c.rank() == 0 ? 8 : 6, DType::F32, Reduce::Sum);
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("8 elements"), std::string::npos) << m;
    EXPECT_NE(m.find("6 elements"), std::string::npos) << m;
  }
}

// Promptly: the waiting ranks are released by the abort (their barrier fails naming rank 2's
// error), not by their timeout ("never came"); a release that never comes is left to ctest's timeout.
TEST(LocalComm, AFailingRankReleasesTheOthersPromptly) {
  std::vector<std::string> released(4);
  try {
    LocalWorld::run(4, [&](Communicator& c) {
      if (c.rank() == 2) throw Error("rank two broke");
      try {
        c.barrier();  // ranks 0, 1, 3 wait here for rank 2
      } catch (const Error& e) {
        released[static_cast<size_t>(c.rank())] = e.what();
        throw;
      }
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 failed: rank two broke"), std::string::npos) << e.what();
  }
  for (int r : {0, 1, 3}) {
    const std::string& m = released[static_cast<size_t>(r)];
    EXPECT_NE(m.find("aborted on rank " + std::to_string(r) + ": rank 2 failed: rank two broke"), std::string::npos)
        << "rank " << r << ": " << m;
  }
}

TEST(LocalComm, AMissingRankTimesOut) {
  try {
    LocalWorld::run(2, [](Communicator& c) {
      if (c.rank() == 0) c.barrier();  // rank 1 never comes, but does not fail either
    }, std::chrono::milliseconds(200));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never came"), std::string::npos) << e.what();
  }
}

// The base class's start_send / start_recv make the blocking call at the wait (NCCL, exchange).
TEST(LocalComm, TheDefaultStartedSendAndRecvMakeTheirCallsAtTheWait) {
  for (int n = 2; n <= 4; ++n) {
    SCOPED_TRACE(n);
    LocalWorld::run(n, [](Communicator& c) {
      Forwarder d(c);
      checks::started_send_recv(d, false);
    });
  }
}

TEST(LocalComm, AStartedRecvOfAnotherSizeIsAnErrorAtItsWaitNamingBothSizes) {
  for (bool posted_first : {true, false}) {
    SCOPED_TRACE(posted_first);
    LocalWorld::run(2, [posted_first](Communicator& c) {
      std::vector<float> buf(4, 1.5f);
      if (c.rank() == 0) {
        if (!posted_first) c.send(buf.data(), 4, DType::F32, 1, 7);
        c.barrier();
        if (posted_first) c.send(buf.data(), 4, DType::F32, 1, 7);
        c.send(buf.data(), 2, DType::F32, 1, 7);
        return;
      }
      std::unique_ptr<Request> request;
      if (posted_first) request = c.start_recv(buf.data(), 3, DType::F32, 0, 7);
      c.barrier();
      if (!posted_first) request = c.start_recv(buf.data(), 3, DType::F32, 0, 7);  // the message is queued
      try {
        request->wait();
        ADD_FAILURE() << "expected an Error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("recv: rank 1 expects 3 elements of f32 (12 bytes) from rank 0 (tag 7), but "
                                             "the message has 16 bytes"),
                  std::string::npos)
            << e.what();
      }
      // The wrong message is off the channel: the next one arrives.
      std::fill(buf.begin(), buf.end(), 0.0f);
      c.recv(buf.data(), 2, DType::F32, 0, 7);
      EXPECT_EQ(buf[1], 1.5f);
      EXPECT_EQ(buf[2], 0.0f);
    });
  }
}

// A started receive dropped without a wait (a step unwinding from an error) leaves its channel:
// the message goes to the next receive, and nothing writes into the dropped one's buffer.
TEST(LocalComm, AStartedRecvDroppedUnwaitedLeavesItsChannel) {
  LocalWorld::run(2, [](Communicator& c) {
    float x = 2.5f, dropped = -1, kept = -1;
    if (c.rank() == 0) {
      c.barrier();
      c.send(&x, 1, DType::F32, 1, 2);
      return;
    }
    c.start_recv(&dropped, 1, DType::F32, 0, 2).reset();
    auto request = c.start_recv(&kept, 1, DType::F32, 0, 2);
    c.barrier();
    request->wait();
    EXPECT_EQ(kept, 2.5f);
    EXPECT_EQ(dropped, -1.0f);
  });
}

TEST(LocalComm, ARankFailingReleasesTheOthersWaitingForAStartedRecv) {
  try {
    LocalWorld::run(3, [](Communicator& c) {
      float x = 0;
      if (c.rank() == 1) throw Error("rank one broke");
      c.start_recv(&x, 1, DType::F32, c.rank() == 0 ? 1 : 0, 4)->wait();  // nobody ever sends
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed: rank one broke"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::comm
