// The mpi backend, run on every rank of `mpirun -np 2` and `-np 4` (see main.cc). Every test
// calls the same collectives on every rank; expected values come from closed formulas.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>

#include "../comm/collective_checks.h"
#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

MpiComm& world() { return *mpi_world(); }

// Restores the world's settings when a test changes them.
struct Settings {
  Settings() = default;
  ~Settings() {
    world().set_checks(true);
    world().set_max_count(INT_MAX);
  }
};

TEST(MpiComm, WorldIsTheMpirunJob) {
  ASSERT_TRUE(launched_by_mpirun());
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_EQ(world().size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(world().rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
}

TEST(MpiComm, EveryOperation) { checks::all(world()); }

TEST(MpiComm, EveryOperationWithChecksOff) {
  Settings restore;
  world().set_checks(false);
  checks::all(world());
}

// With at most 3 elements per MPI call every operation takes its large-count path: reductions in
// chunks, whole-block datatypes, per-rank fallbacks of the v variants. With INT_MAX these paths
// serve counts above 2^31 - 1.
TEST(MpiComm, EveryOperationInChunksOfThreeElements) {
  Settings restore;
  world().set_max_count(3);
  checks::all(world());
  world().set_max_count(1);
  checks::all(world());
}

TEST(MpiComm, EveryOperationOnAGroupInReverseOrder) {
  std::vector<int> reversed(world().members().rbegin(), world().members().rend());
  auto group = world().group(reversed);
  EXPECT_EQ(group->rank(), world().size() - 1 - world().rank());
  EXPECT_EQ(group->members(), reversed);
  checks::all(*group);
}

TEST(MpiComm, HalfPrecisionBoolAndIntegerReductions) {
  const int n = world().size(), me = world().rank();
  const int64_t count = 24;
  // Small integers: every partial sum and product is exact in f16 and bf16.
  auto value = [](int r, int64_t i) { return static_cast<double>((r + 1) + i % 3) * (i % 2 ? -1 : 1); };
  for (DType dtype : {DType::F16, DType::BF16}) {
    for (Reduce op : {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min, Reduce::Prod}) {
      std::vector<uint16_t> buf(count);
      for (int64_t i = 0; i < count; ++i) {
        float v = static_cast<float>(value(me, i));
        buf[i] = dtype == DType::F16 ? f16(v).bits : bf16(v).bits;
      }
      world().all_reduce(buf.data(), buf.data(), count, dtype, op);
      for (int64_t i = 0; i < count; ++i) {
        double want = value(0, i);
        for (int r = 1; r < n; ++r) {
          double v = value(r, i);
          want = op == Reduce::Prod ? want * v : op == Reduce::Max ? std::max(want, v)
               : op == Reduce::Min ? std::min(want, v) : want + v;
        }
        if (op == Reduce::Avg) want /= n;
        uint16_t bits = dtype == DType::F16 ? f16(static_cast<float>(want)).bits : bf16(static_cast<float>(want)).bits;
        ASSERT_EQ(buf[i], bits) << dtype_name(dtype) << " " << reduce_name(op) << " element " << i << " want " << want;
      }
    }
  }
  // Bool: sum, avg and max are "or", prod and min "and". Element i is true on rank r iff bit r of i.
  for (Reduce op : {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Prod, Reduce::Min}) {
    std::vector<uint8_t> flags(32);
    for (int i = 0; i < 32; ++i) flags[i] = (i >> me) & 1;
    world().all_reduce(flags.data(), flags.data(), 32, DType::Bool, op);
    int mask = (1 << n) - 1;
    bool any = op == Reduce::Sum || op == Reduce::Avg || op == Reduce::Max;
    for (int i = 0; i < 32; ++i) {
      bool want = any ? (i & mask) != 0 : (i & mask) == mask;
      ASSERT_EQ(flags[i], want) << reduce_name(op) << " element " << i;
    }
  }
  // Integer avg: the sum divided by the group size, truncated toward zero (as in C++).
  std::vector<int32_t> ints(5);
  for (int i = 0; i < 5; ++i) ints[i] = (me == 0 ? -9 : 2) + i;
  world().all_reduce(ints.data(), ints.data(), 5, DType::I32, Reduce::Avg);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ints[i], (-9 + 2 * (n - 1) + n * i) / n) << "element " << i;
}

// Values whose sums round, with NaN and signed zeros, so that any disagreement between ranks shows.
float awkward(int r, int64_t i) {
  uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(r * 40503u + 17u);
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  if (i % 101 == 7) return r % 2 ? -0.0f : 0.0f;
  if (i % 211 == 5 && r == 1) return std::nanf("");
  return std::ldexp(static_cast<float>(h % 2000003) - 1e6f, static_cast<int>(h % 23) - 11);
}

TEST(MpiComm, EveryRankGetsTheSameBits) {
  const int n = world().size(), me = world().rank();
  // 37 elements take OpenMPI's small-message algorithm, 1 Mi elements its large-message one.
  for (int64_t count : {int64_t{37}, int64_t{1} << 20}) {
    for (Reduce op : {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min}) {
      for (DType dtype : {DType::F32, DType::BF16}) {
        std::vector<float> mine(count);
        for (int64_t i = 0; i < count; ++i) mine[i] = awkward(me, i);
        std::vector<std::byte> in(count * dtype_size(dtype)), out(in.size());
        if (dtype == DType::F32) std::memcpy(in.data(), mine.data(), in.size());
        for (int64_t i = 0; dtype == DType::BF16 && i < count; ++i) {
          uint16_t b = bf16(mine[i]).bits;
          std::memcpy(in.data() + 2 * i, &b, 2);
        }
        world().all_reduce(in.data(), out.data(), count, dtype, op);
        std::vector<std::byte> all(out.size() * n);
        world().all_gather(out.data(), all.data(), static_cast<int64_t>(out.size()), DType::U8);
        for (int r = 1; r < n; ++r) {
          ASSERT_EQ(std::memcmp(all.data(), all.data() + r * out.size(), out.size()), 0)
              << "rank " << r << " got other bits than rank 0: " << count << " " << dtype_name(dtype) << " "
              << reduce_name(op);
        }
        auto got_at = [&](int64_t i) {
          if (dtype == DType::F32) {
            float f;
            std::memcpy(&f, out.data() + 4 * i, 4);
            return f;
          }
          bf16 b;
          std::memcpy(&b.bits, out.data() + 2 * i, 2);
          return static_cast<float>(b);
        };
        if (op == Reduce::Max || op == Reduce::Min) {
          // As in the local backend: NaN wins; max(-0, +0) = +0 and min(-0, +0) = -0.
          for (int64_t i = 5; i < count; i += 211) {
            if (i % 101 != 7) {
              EXPECT_TRUE(std::isnan(got_at(i))) << "element " << i;
            }
          }
          for (int64_t i = 7; i < count; i += 101) {
            if (i % 211 == 5) continue;
            EXPECT_EQ(got_at(i), 0.0f);
            EXPECT_EQ(std::signbit(got_at(i)), op == Reduce::Min) << reduce_name(op) << " of signed zeros, element " << i;
          }
        }
        if (dtype != DType::F32 || op != Reduce::Sum) continue;
        // Against the exact sum: float rounding of n - 1 additions at most.
        for (int64_t i = 0; i < count; i += 97) {
          double exact = 0, magnitude = 0;
          for (int r = 0; r < n; ++r) exact += awkward(r, i), magnitude += std::abs(awkward(r, i));
          float got;
          std::memcpy(&got, out.data() + 4 * i, 4);
          if (std::isnan(exact)) EXPECT_TRUE(std::isnan(got)) << i;
          else EXPECT_LE(std::abs(got - exact), n * 6e-8 * magnitude) << "element " << i;
        }
      }
    }
  }
}

// Runs fn on every rank and returns its Error message, "no error" if it threw none.
std::string error_of(const std::function<void(MpiComm&)>& fn) {
  try {
    fn(world());
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Every rank must have raised the same message, and it must contain `part`.
void expect_everywhere(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << message;
  auto all = world().all_gather_bytes(std::as_bytes(std::span(message)));
  for (size_t r = 0; r < all.size(); ++r) {
    std::string theirs(reinterpret_cast<const char*>(all[r].data()), all[r].size());
    EXPECT_EQ(theirs, message) << "rank " << r << " raised another message";
  }
}

TEST(MpiComm, MismatchesRaiseTheSameErrorOnEveryRank) {
  const int n = world().size(), last = n - 1;
  std::vector<float> in(64), out(64 * 4);
  expect_everywhere(error_of([&](MpiComm& c) {
                      if (c.rank() == 0) c.broadcast(in.data(), 1, DType::F32, 0);
                      else c.all_reduce(in.data(), out.data(), 1, DType::F32, Reduce::Sum);
                    }),
                    "collective mismatch: rank 0 called broadcast while rank 1 called all_reduce");
  expect_everywhere(error_of([&](MpiComm& c) {
                      c.all_reduce(in.data(), out.data(), c.rank() == last ? 6 : 8, DType::F32, Reduce::Sum);
                    }),
                    fmt::format("all_reduce: rank 0 passes 8 elements of f32 but rank {} passes 6 elements of f32", last));
  expect_everywhere(error_of([&](MpiComm& c) {
                      c.all_gather(in.data(), out.data(), 4, c.rank() == 1 ? DType::I32 : DType::F32);
                    }),
                    "all_gather: rank 0 passes 4 elements of f32 but rank 1 passes 4 elements of i32");
  expect_everywhere(error_of([&](MpiComm& c) { c.broadcast(in.data(), 2, DType::F32, c.rank()); }),
                    "broadcast: rank 0 uses root 0 but rank 1 uses root 1");
  expect_everywhere(error_of([&](MpiComm& c) {
                      c.reduce_scatter(in.data(), out.data(), 2, DType::F32, c.rank() ? Reduce::Max : Reduce::Sum);
                    }),
                    "reduce_scatter: rank 0 reduces with sum but rank 1 with max");
  std::vector<int64_t> ones(static_cast<size_t>(n), 1), other = ones;
  other[0] = 2;
  expect_everywhere(error_of([&](MpiComm& c) {
                      c.all_gather_v(in.data(), out.data(), c.rank() == 1 ? other : ones, DType::F32);
                    }),
                    fmt::format("all_gather_v: rank 0 passes counts [{}] but rank 1 passes [{}]", fmt::join(ones, ","),
                                fmt::join(other, ",")));
  expect_everywhere(error_of([&](MpiComm& c) {
                      std::vector<int64_t> recv = ones;
                      if (c.rank() == last) recv[0] = 4;  // rank 0 sends 1 element to the last rank
                      c.all_to_all_v(in.data(), ones, out.data(), recv, DType::F32);
                    }),
                    fmt::format("all_to_all_v: rank 0 sends 1 elements to rank {0}, but rank {0} expects 4 from rank 0",
                                last));
  expect_everywhere(error_of([&](MpiComm& c) {
                      // One piece of 1 element per rank; the last rank expects a second piece from rank 0.
                      std::vector<int64_t> first(static_cast<size_t>(n + 1)), offset(static_cast<size_t>(n)), count(offset.size(), 1);
                      std::iota(first.begin(), first.end(), int64_t{0});
                      std::iota(offset.begin(), offset.end(), int64_t{0});
                      std::vector<int64_t> rfirst = first, roffset = offset, rcount = count;
                      if (c.rank() == last) {
                        for (size_t i = 1; i < rfirst.size(); ++i) ++rfirst[i];
                        roffset.push_back(n), rcount.push_back(1);
                      }
                      c.all_to_all_pieces(in.data(), Pieces{first, offset, count}, out.data(),
                                          Pieces{rfirst, roffset, rcount}, DType::F32);
                    }),
                    fmt::format("all_to_all_pieces: rank 0 sends 1 elements to rank {0}, but rank {0} expects 2 from rank 0",
                                last));
  // The communicator still works after the errors.
  checks::all_reduce_every_op(world());
}

// Inside a CheckedByCaller scope the world's collectives skip the signature exchange and still
// give every result; a scope on another communicator leaves the world's calls checked.
TEST(MpiComm, CheckedByCallerSkipsTheChecksOfItsCommunicatorOnly) {
  {
    CheckedByCaller scope(&world());
    checks::all(world());
  }
  std::vector<int> reversed(world().members().rbegin(), world().members().rend());
  auto group = world().group(reversed);
  CheckedByCaller scope(group.get());
  std::vector<float> in(8), out(8);
  expect_everywhere(error_of([&](MpiComm& c) {
                      if (c.rank() == 0) c.broadcast(in.data(), 1, DType::F32, 0);
                      else c.all_reduce(in.data(), out.data(), 1, DType::F32, Reduce::Sum);
                    }),
                    "collective mismatch: rank 0 called broadcast while rank 1 called all_reduce");
  checks::all_to_all_pieces_filled(*group);
}

TEST(MpiComm, RecvOfAnotherSizeIsAnErrorNamingBothSizes) {
  const int me = world().rank();
  std::vector<float> buf(4, 1.5f);
  std::string message = "no error";
  if (me == 0) {
    world().send(buf.data(), 4, DType::F32, 1, 7);
    world().send(buf.data(), 2, DType::F32, 1, 7);
  } else if (me == 1) {
    try {
      world().recv(buf.data(), 3, DType::F32, 0, 7);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("recv: rank 1 expects 3 elements of f32 (12 bytes) from rank 0 (tag 7), but the message "
                           "has 16 bytes"),
              std::string::npos)
        << message;
    // The wrong message was taken off the channel: the next one arrives.
    std::fill(buf.begin(), buf.end(), 0.0f);
    world().recv(buf.data(), 2, DType::F32, 0, 7);
    EXPECT_EQ(buf[0], 1.5f);
    EXPECT_EQ(buf[2], 0.0f);
  }
  world().barrier();
}

TEST(MpiComm, AStartedRecvOfAnotherSizeIsAnErrorAtItsWait) {
  const int me = world().rank();
  std::vector<float> buf(4, 1.5f);
  if (me == 0) {
    world().send(buf.data(), 2, DType::F32, 1, 7);
    world().send(buf.data(), 4, DType::F32, 1, 7);
    world().send(buf.data(), 1, DType::F32, 1, 7);
  } else if (me == 1) {
    std::string smaller = "no error", larger = "no error";
    auto first = world().start_recv(buf.data(), 3, DType::F32, 0, 7);
    auto second = world().start_recv(buf.data(), 3, DType::F32, 0, 7);
    try {
      first->wait();
    } catch (const Error& e) {
      smaller = e.what();
    }
    try {
      second->wait();
    } catch (const Error& e) {
      larger = e.what();
    }
    EXPECT_NE(smaller.find("recv: rank 1 expects 3 elements of f32 (12 bytes) from rank 0 (tag 7), but the message "
                           "has 8 bytes"),
              std::string::npos)
        << smaller;
    EXPECT_NE(larger.find("recv: rank 1 expects 3 elements of f32 (12 bytes) from rank 0 (tag 7), but the message "
                          "is larger"),
              std::string::npos)
        << larger;
    std::fill(buf.begin(), buf.end(), 0.0f);
    world().recv(buf.data(), 1, DType::F32, 0, 7);
    EXPECT_EQ(buf[0], 1.5f);
  }
  world().barrier();
}

TEST(MpiComm, BadArgumentsAreErrors) {
  float x = 0;
  auto message = error_of([&](MpiComm& c) { c.send(&x, 1, DType::F32, (c.rank() + 1) % c.size(), -3); });
  EXPECT_NE(message.find("send: tag -3 is outside 0 .. "), std::string::npos) << message;
  message = error_of([&](MpiComm& c) { c.broadcast(&x, 1, DType::F32, c.size()); });
  EXPECT_NE(message.find(fmt::format("root {0} is not a rank of a group of {0}", world().size())), std::string::npos)
      << message;
  message = error_of([&](MpiComm& c) { c.set_max_count(0); });
  EXPECT_NE(message.find("max count 0 is outside 1 .. 2147483647"), std::string::npos) << message;
}

// 2^31 + 5 bytes really travel (about 4.3 GB per rank in all): opt-in with SHARDWISE_TEST_LARGE=1.
TEST(MpiComm, CountsAboveIntMax) {
  const char* large = std::getenv("SHARDWISE_TEST_LARGE");
  if (!large || std::string(large) != "1") GTEST_SKIP() << "opt-in (moves 2^31 + 5 bytes per rank): SHARDWISE_TEST_LARGE=1 ctest -R comm_mpi_np2_counts_above_int_max";
  const int64_t count = int64_t{INT_MAX} + 6;
  std::vector<uint8_t> buf(static_cast<size_t>(count));
  const int me = world().rank();
  for (int64_t i = 0; i < count; i += 4096) buf[static_cast<size_t>(i)] = static_cast<uint8_t>(me + i / 4096);
  buf[static_cast<size_t>(count - 1)] = static_cast<uint8_t>(me + 1);
  world().broadcast(buf.data(), count, DType::U8, 0);
  for (int64_t i = 0; i < count; i += 4096) ASSERT_EQ(buf[static_cast<size_t>(i)], static_cast<uint8_t>(i / 4096)) << i;
  EXPECT_EQ(buf[static_cast<size_t>(count - 1)], 1);
  // Sum of the ranks' last bytes (r + 1) and of the broadcast first bytes (0 on every rank).
  buf[static_cast<size_t>(count - 1)] = static_cast<uint8_t>(me + 1);
  world().all_reduce(buf.data(), buf.data(), count, DType::U8, Reduce::Sum);
  const int n = world().size();
  EXPECT_EQ(buf[static_cast<size_t>(count - 1)], n * (n + 1) / 2);
  EXPECT_EQ(buf[4096], static_cast<uint8_t>(n * 1));
}

}  // namespace
}  // namespace shardwise::comm
