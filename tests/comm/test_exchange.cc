// The exchange backend (comm/exchange_communicator.h) over an in-memory exchange and over the file
// rendezvous (comm/file_rendezvous.h), ranks as threads: every collective gives the local backend's
// bytes and passes the backend-independent checks; mismatches, missing messages and missing ranks
// are Errors that say so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "../support/memory_exchange.h"
#include "collective_checks.h"
#include "shardwise/comm/exchange_communicator.h"
#include "shardwise/comm/file_rendezvous.h"
#include "shardwise/comm/local.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::comm {
namespace {

namespace fs = std::filesystem;
using testing::MemoryExchange;
using testing::MemoryHub;
using namespace std::chrono_literals;

// Runs fn(rank) on `n` threads; each rank's error ("" when none).
std::vector<std::string> on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

fs::path fresh_dir(const std::string& tag) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / fmt::format("sw_rdv_{}_{}_{}", tag, ::getpid(), counter++);
  fs::remove_all(p);
  return p;
}

enum class Kind { Memory, MemoryWithoutMessages, Files };

// Runs fn(comm) on `n` ranks as threads, each with an ExchangeCommunicator over its own exchange.
std::vector<std::string> on_exchange(Kind kind, int n, const std::function<void(Communicator&)>& fn,
                                     fs::path dir = {}) {
  auto hub = std::make_shared<MemoryHub>(n, kind != Kind::MemoryWithoutMessages);
  if (dir.empty()) dir = fresh_dir("run");
  auto errors = on_threads(n, [&](int r) {
    std::shared_ptr<ByteExchange> e;
    if (kind == Kind::Files) e = std::make_shared<FileRendezvous>(dir, r, n, 20s);
    else e = std::make_shared<MemoryExchange>(hub, r);
    ExchangeCommunicator c(e);
    fn(c);
  });
  fs::remove_all(dir);
  return errors;
}

// Every check of tests/comm/collective_checks.h but sub-groups and shared regions (the exchange
// backend has neither); send/recv only where the exchange has messages.
void every_check(Communicator& c, bool messages) {
  checks::all_reduce_every_op(c);
  checks::reduce_to_every_root(c);
  checks::broadcast_from_every_root(c);
  checks::all_gather_equal_and_unequal(c);
  checks::reduce_scatter_equal_and_unequal(c);
  checks::all_to_all_equal_and_v(c);
  checks::all_to_all_pieces_scattered(c);
  checks::all_to_all_pieces_filled(c);
  if (messages) checks::send_recv_ring_and_tags(c);
  checks::objects_and_bytes(c);
  checks::started_collectives(c);
}

TEST(ExchangeComm, EveryCheckOn1To4RanksInMemory) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE(n);
    expect_no_errors(on_exchange(Kind::Memory, n, [](Communicator& c) { every_check(c, true); }));
    expect_no_errors(on_exchange(Kind::MemoryWithoutMessages, n, [](Communicator& c) { every_check(c, false); }));
  }
}

TEST(ExchangeComm, EveryCheckOn3RanksThroughFiles) {
  expect_no_errors(on_exchange(Kind::Files, 3, [](Communicator& c) { every_check(c, true); }));
}

// Every rank's results of a few collectives in a few dtypes, as bytes, in call order.
std::vector<std::string> results_of(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<std::string> out;
  auto keep = [&](const Tensor& t) { out.emplace_back(reinterpret_cast<const char*>(t.raw()), t.nbytes()); };
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::I32}) {
    const int64_t count = 11;
    Tensor in(dtype, Shape{count * n});
    for (int64_t i = 0; i < in.numel(); ++i) in.set_at(i, (me + 1) * 0.37 + static_cast<double>(i) * 0.011 - 0.05 * (i % 3));
    if (dtype == DType::I64 || dtype == DType::I32) {
      for (int64_t i = 0; i < in.numel(); ++i) in.set_at(i, static_cast<double>((me + 2) * (i % 5 + 1) - 3));
    }
    for (Reduce op : {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min, Reduce::Prod}) {
      Tensor o(dtype, Shape{count});
      c.all_reduce(in.raw(), o.raw(), count, dtype, op);
      keep(o);
    }
    Tensor b = in.clone();
    c.broadcast(b.raw(), count, dtype, n - 1);
    keep(b);
    std::vector<int64_t> counts;
    for (int r = 0; r < n; ++r) counts.push_back((r * 2 + 1) % 4);
    Tensor g(dtype, Shape{count * n});
    c.all_gather_v(in.raw(), g.raw(), counts, dtype);
    keep(g);
    Tensor s(dtype, Shape{count});
    c.reduce_scatter_v(in.raw(), s.raw(), counts, dtype, Reduce::Sum);
    keep(s);
    std::vector<int64_t> send, recv;
    for (int p = 0; p < n; ++p) send.push_back((me + p) % 3), recv.push_back((p + me) % 3);
    Tensor a(dtype, Shape{count * n});
    c.all_to_all_v(in.raw(), send, a.raw(), recv, dtype);
    keep(a);
  }
  return out;
}

TEST(ExchangeComm, CollectivesGiveTheLocalBackendsBytes) {
  const int n = 4;
  std::vector<std::vector<std::string>> local(n);
  LocalWorld::run(n, [&](Communicator& c) { local[static_cast<size_t>(c.rank())] = results_of(c); });
  for (Kind kind : {Kind::Memory, Kind::Files}) {
    std::vector<std::vector<std::string>> got(n);
    expect_no_errors(on_exchange(kind, n, [&](Communicator& c) { got[static_cast<size_t>(c.rank())] = results_of(c); }));
    for (size_t r = 0; r < n; ++r) {
      ASSERT_EQ(got[r].size(), local[r].size());
      for (size_t k = 0; k < got[r].size(); ++k) {
        EXPECT_TRUE(got[r][k] == local[r][k]) << (kind == Kind::Files ? "files" : "memory") << " rank " << r
                                              << " result " << k << " differs from the local backend's";
      }
    }
  }
}

TEST(ExchangeComm, AMismatchIsTheSameErrorOnEveryRank) {
  auto errors = on_exchange(Kind::Memory, 3, [](Communicator& c) {
    std::vector<float> in(4, 1.0f), out(4);
    c.all_reduce(in.data(), out.data(), c.rank() == 1 ? 3 : 4, DType::F32, Reduce::Sum);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("all_reduce: rank 0 passes 4 elements of f32 but rank 1 passes 3 elements of f32"), std::string::npos) << e;
  }
  errors = on_exchange(Kind::Memory, 2, [](Communicator& c) {
    std::vector<int64_t> in(4), out(4), send = {1, 1}, recv = {1, c.rank() == 0 ? 2 : 1};
    c.all_to_all_v(in.data(), send, out.data(), recv, DType::I64);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("rank 1 sends 1 elements to rank 0, but rank 0 expects 2 from rank 1"), std::string::npos) << e;
  }
}

TEST(ExchangeComm, WithoutMessagesSendIsAnErrorAndSubGroupsAreAnError) {
  auto errors = on_exchange(Kind::MemoryWithoutMessages, 2, [](Communicator& c) {
    EXPECT_FALSE(has_point_to_point(c));
    EXPECT_EQ(c.backend(), "exchange");
    int v = 0;
    if (c.rank() == 0) c.send(&v, 1, DType::I32, 1);
  });
  EXPECT_NE(errors[0].find("send to rank 1 (tag 0): memory exchange (rank 0 of 2) has no point-to-point messages"),
            std::string::npos) << errors[0];
  errors = on_exchange(Kind::Memory, 2, [](Communicator& c) {
    EXPECT_TRUE(has_point_to_point(c));
    std::vector<int> all = {0, 1};
    c.group(all);
  });
  EXPECT_NE(errors[1].find("group: the exchange backend (memory exchange (rank 1 of 2)) has no sub-groups"),
            std::string::npos) << errors[1];
}

}  // namespace
}  // namespace shardwise::comm
