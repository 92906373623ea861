#pragma once
// The `local` backend: N ranks as threads of one process, exchanging through shared memory.
//
// Every collective is a rendezvous of the group's members: each deposits its buffers, all wait
// until all have arrived, each computes its own result (reductions add in rank order, so every
// rank gets the same bits), and all wait again before returning, so no buffer is reused while a
// peer still reads it. If a rank fails, LocalWorld::run aborts the world: every rank waiting to
// start a collective (or in recv) gets an Error (naming the failed rank) within about 50 ms. A
// collective every member has started ends first, whatever happens meanwhile: a member leaves it
// (returns or throws, freeing its buffers) only when every member is done reading them. A member
// that fails inside one (a check, an allocation) ends it for all: its peers get an Error naming it
// and its error. A rank that never arrives makes the others fail with an Error after `timeout`.
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>

#include "shardwise/comm/call_check.h"
#include "shardwise/comm/communicator.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

// Test hooks (tests/comm/test_local_failures.cc): they make the moments of a failure inside a
// collective deterministic. Each is called on the rank's own thread with its global rank.
struct LocalHooks {
  using Inside = std::function<void(int rank, Collective op)>;
  using Waiting = std::function<void(int rank)>;
  // The rank met every member at the start of collective `op` and is about to read their buffers
  // (a throw here is a failure of the rank inside the collective).
  Inside inside;
  // The rank waits for its peers at a later meeting of a collective (called before each sleep,
  // with the group's lock held: it must not call the communicator).
  Waiting waiting;
};

class LocalWorld : public std::enable_shared_from_this<LocalWorld> {
 public:
  static std::shared_ptr<LocalWorld> create(int size, std::chrono::milliseconds timeout = std::chrono::seconds(300));
  int size() const { return size_; }
  // The world communicator of `rank`.
  std::shared_ptr<Communicator> communicator(int rank);
  // Marks the world failed: every rank waiting in (or later entering) a collective throws. The
  // first reason and its kind (core/error.h) are kept: run() rethrows them.
  void abort(std::string reason, ErrorKind kind = ErrorKind::General);
  bool aborted() const { return aborted_.load(); }
  std::string abort_reason() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Before any rank runs.
  void set_hooks(LocalHooks hooks) { hooks_ = std::move(hooks); }
  const LocalHooks& hooks() const { return hooks_; }

  // Runs fn(comm) on `size` threads, one per rank. If any rank throws, the world is aborted and
  // the first error is rethrown here (prefixed with the rank, with its kind) after every thread has
  // finished.
  static void run(int size, const std::function<void(Communicator&)>& fn,
                  std::chrono::milliseconds timeout = std::chrono::seconds(300));

  struct Group;  // shared state of one group (internal)
  std::shared_ptr<Group> group_state(const std::vector<int>& members);

 private:
  LocalWorld(int size, std::chrono::milliseconds timeout) : size_(size), timeout_(timeout) {}
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;
  ErrorKind kind_ = ErrorKind::General;
  std::map<std::vector<int>, std::shared_ptr<Group>> groups_;
  LocalHooks hooks_;
};

}  // namespace shardwise::comm
