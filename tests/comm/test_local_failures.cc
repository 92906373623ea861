// A rank that fails while the local (threads) backend's collectives read its buffers: a rank that
// fails inside a collective, or whose group's peers are inside one when another rank of the world
// fails, leaves only once every peer is done with its buffers (ASan sees no access to freed
// memory), and the peers get the failing rank's error. The moments are made by the backend's test
// hooks (LocalHooks) and the ranks waiting on each other's events, not by sleeps:
//  - the owner (group rank 0) of a buffer the reader (group rank 1) reads fails inside, or leaves
//    the collective because the world was aborted, while the reader has not read yet;
//  - the reader reads once the owner has left the collective (its buffers freed: the failure
//    before the fix) or waits at a meeting inside it (the fix).
// Every collective of the backend, the shared regions' growth and exchange of the MoE kernel
// included; send and recv copy the message, so a sender that fails has nothing a peer reads.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

// What the ranks of a test did ("inside", "out", "parked", "failed", each with a global rank); the
// hooks and ranks wait for each other's events.
class Events {
 public:
  void note(const std::string& what, int rank) {
    {
      std::lock_guard lock(mu_);
      seen_.insert({what, rank});
    }
    cv_.notify_all();
  }
  // Waits until `ready` (called with the events, under the lock). A guard against a hang, not a
  // timing: a test whose events never come fails naming what it waited for.
  template <class Ready>
  void await(const char* what, Ready ready) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::minutes(2), [&] { return ready(seen_); }))
      throw std::runtime_error(std::string("test: never saw ") + what);
  }
  using Seen = std::set<std::pair<std::string, int>>;
  static bool has(const Seen& s, const std::string& what, int rank) { return s.count({what, rank}) > 0; }
  bool saw(const std::string& what, int rank) {
    std::lock_guard lock(mu_);
    return has(seen_, what, rank);
  }
  // Only the collective under test calls the hooks (the rank's call is armed).
  std::atomic<bool> armed[3] = {};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Seen seen_;
};

// Arms rank `rank`'s hooks for the call it makes while alive.
struct Armed {
  Armed(Events& e, int rank) : e(e), rank(rank) { e.armed[rank] = true; }
  ~Armed() { e.armed[rank] = false; }
  Events& e;
  int rank;
};

// `op` on a group of 2 (group rank 0 the owner, 1 the reader), on heap buffers freed when the call
// leaves (by a return or a throw).
void call(Communicator& c, const std::string& op, Events& e) {
  const int64_t n = 40, p = c.size();
  const int me = c.members()[static_cast<size_t>(c.rank())];
  std::vector<float> in(static_cast<size_t>(n * p), static_cast<float>(c.rank() + 1)), out(in.size());
  std::vector<int64_t> counts(static_cast<size_t>(p), n), first = {0, 1, 2}, offset = {0, n}, count = {n, n};
  const Pieces pieces{first, offset, count};
  const int64_t region = n * p * static_cast<int64_t>(sizeof(float));
  SharedRegions regions;
  if (op == "shared_exchange") regions = c.shared_regions(region);  // made before the call under test
  Armed armed(e, me);
  if (op == "all_reduce") c.all_reduce(in.data(), out.data(), n, DType::F32, Reduce::Sum);
  else if (op == "reduce") c.reduce(in.data(), out.data(), n, DType::F32, Reduce::Sum, 1);  // rank 1 reads
  else if (op == "broadcast") c.broadcast(in.data(), n, DType::F32, 0);
  else if (op == "all_gather") c.all_gather(in.data(), out.data(), n, DType::F32);
  else if (op == "all_gather_v") c.all_gather_v(in.data(), out.data(), counts, DType::F32);
  else if (op == "reduce_scatter") c.reduce_scatter(in.data(), out.data(), n, DType::F32, Reduce::Sum);
  else if (op == "reduce_scatter_v") c.reduce_scatter_v(in.data(), out.data(), counts, DType::F32, Reduce::Sum);
  else if (op == "all_to_all") c.all_to_all(in.data(), out.data(), n, DType::F32);
  else if (op == "all_to_all_v") c.all_to_all_v(in.data(), counts, out.data(), counts, DType::F32);
  else if (op == "all_to_all_pieces") c.all_to_all_pieces(in.data(), pieces, out.data(), pieces, DType::F32);
  else if (op == "barrier") c.barrier();
  else if (op == "shared_regions") c.shared_regions(region);  // the first call: the regions are made
  else if (op == "shared_exchange") {
    c.shared_exchange(n * static_cast<int64_t>(sizeof(float)), [&](int peer) {
      std::memcpy(regions.at[static_cast<size_t>(peer)] + c.rank() * n * sizeof(float), in.data(), n * sizeof(float));
    });
  } else {
    throw std::logic_error("test: unknown collective " + op);
  }
}

// Runs fn(world communicator) on `size` threads of a world with `hooks`, like LocalWorld::run (a
// rank that throws aborts the world), and returns each rank's error ("" for none). A failed rank
// notes "failed" once the world is aborted.
std::vector<std::string> run_ranks(int size, LocalHooks hooks, Events& e, const std::function<void(Communicator&)>& fn) {
  auto world = LocalWorld::create(size, std::chrono::minutes(2));
  world->set_hooks(std::move(hooks));
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*world->communicator(r));
      } catch (const std::exception& ex) {
        errors[static_cast<size_t>(r)] = ex.what();
        world->abort(fmt::format("rank {} failed: {}", r, ex.what()));
        e.note("failed", r);
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The hooks of a test: inside the call under test, each rank notes "inside"; the owner then runs
// `owner` (a throw: its failure), the reader waits for the owner; the owner notes "parked" when it
// waits at a meeting after it got inside.
LocalHooks hooks_of(Events& e, const std::function<void()>& owner) {
  LocalHooks hooks;
  hooks.inside = [&e, owner](int rank, Collective) {
    if (!e.armed[rank]) return;
    e.note("inside", rank);
    if (rank == 0) return owner();
    e.await("rank 0 leave the collective or wait inside it",
            [](const Events::Seen& s) { return Events::has(s, "out", 0) || Events::has(s, "parked", 0); });
  };
  hooks.waiting = [&e](int rank) {
    if (rank == 0 && e.armed[0] && e.saw("inside", 0)) e.note("parked", 0);
  };
  return hooks;
}

class LocalFailure : public testing::TestWithParam<std::string> {};

// Rank 0 throws inside the collective while rank 1 has yet to read its buffers: rank 1 gets rank
// 0's error from the collective itself.
TEST_P(LocalFailure, ARankThatFailsInsideACollectiveLeavesOnlyWhenItsPeersAreDone) {
  const std::string op = GetParam();
  Events e;
  const LocalHooks hooks = hooks_of(e, [&] { throw Error(fmt::format("planted failure of rank 0 in {}", op)); });
  std::vector<std::string> errors = run_ranks(2, hooks, e, [&](Communicator& c) {
    try {
      call(c, op, e);
    } catch (...) {
      e.note("out", c.rank());
      throw;
    }
  });
  const std::string planted = "planted failure of rank 0 in " + op;
  EXPECT_NE(errors[0].find(planted), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("on rank 1: rank 0 failed inside it: " + planted), std::string::npos) << errors[1];
}

// Rank 2 (outside the group [0, 1]) fails once both are inside the collective; rank 0 finds the
// world aborted at its next meeting inside it, while rank 1 has yet to read. The collective ends
// normally for both, and their next call on the world gets rank 2's error.
TEST_P(LocalFailure, ACollectiveEveryMemberEnteredEndsWhenAnotherRankFails) {
  const std::string op = GetParam();
  Events e;
  const LocalHooks hooks = hooks_of(
      e, [&] { e.await("rank 2 fail", [](const Events::Seen& s) { return Events::has(s, "failed", 2); }); });
  bool completed[2] = {false, false};
  std::vector<std::string> errors = run_ranks(3, hooks, e, [&](Communicator& c) {
    if (c.rank() == 2) {
      e.await("ranks 0 and 1 inside", [](const Events::Seen& s) {
        return Events::has(s, "inside", 0) && Events::has(s, "inside", 1);
      });
      throw Error("planted failure of rank 2");
    }
    const int pair[] = {0, 1};
    auto group = c.group(pair);
    try {
      call(*group, op, e);
    } catch (...) {
      e.note("out", c.rank());
      throw;
    }
    completed[c.rank()] = true;
    c.barrier();  // rank 2 never comes: the world is aborted
  });
  for (int r : {0, 1}) {
    EXPECT_TRUE(completed[r]) << "rank " << r << ": " << errors[static_cast<size_t>(r)];
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 2 failed: planted failure of rank 2"), std::string::npos)
        << errors[static_cast<size_t>(r)];
  }
}

INSTANTIATE_TEST_SUITE_P(EveryCollective, LocalFailure,
                         testing::Values("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_v",
                                         "reduce_scatter", "reduce_scatter_v", "all_to_all", "all_to_all_v",
                                         "all_to_all_pieces", "barrier", "shared_regions", "shared_exchange"));

// send copies the message: a sender that fails (and frees its buffer) right after its send leaves
// the receiver the whole message; the receiver's next recv gets the sender's error.
TEST(LocalFailure, ASendersBufferIsNotReadAfterTheSend) {
  Events e;
  std::vector<float> got(40, 0.f);
  std::vector<std::string> errors = run_ranks(2, {}, e, [&](Communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> message(40, 7.f);
      c.send(message.data(), 40, DType::F32, 1);
      throw Error("planted failure of rank 0 after its send");
    }
    e.await("rank 0 fail", [](const Events::Seen& s) { return Events::has(s, "failed", 0); });
    c.recv(got.data(), 40, DType::F32, 0);
    c.recv(got.data(), 40, DType::F32, 0);  // never sent
  });
  EXPECT_EQ(got, std::vector<float>(40, 7.f));
  EXPECT_NE(errors[1].find("recv aborted on rank 1: rank 0 failed: planted failure of rank 0 after its send"),
            std::string::npos)
      << errors[1];
}

}  // namespace
}  // namespace shardwise::comm
