#include "shardwise/comm/local.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "shardwise/comm/reduce_kernels.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

struct LocalWorld::Group {
  std::vector<int> members;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  // What each member deposited for the current collective.
  struct Slot {
    const void* in = nullptr;
    void* out = nullptr;
    int64_t count = 0;
    DType dtype = DType::F32;
    int root = -1;
    const char* op = "";
  };
  std::vector<Slot> slots;
};

namespace {

using Group = LocalWorld::Group;

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalWorld> world, std::shared_ptr<LocalWorld::Group> group, int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->members.size()); }
  const std::vector<int>& members() const override { return group_->members; }

  std::shared_ptr<Communicator> group(std::span<const int> global_ranks) override {
    std::vector<int> members(global_ranks.begin(), global_ranks.end());
    int me = group_->members[static_cast<size_t>(rank_)];
    int index = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      SW_CHECK(std::count(group_->members.begin(), group_->members.end(), members[i]) == 1,
               "group: rank {} is not a member of the parent group", members[i]);
      if (members[i] == me) index = static_cast<int>(i);
    }
    SW_CHECK(index >= 0, "group: rank {} asked for a group it is not in", me);
    return std::make_shared<LocalComm>(world_, world_->group_state(members), index);
  }

  void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    Group::Slot& mine = deposit(in, out, count, dtype, -1, "all_reduce");
    (void)mine;
    rendezvous();
    check_same_counts("all_reduce");
    // Reduce in rank order into a private buffer: peers may still read our input if out == in.
    std::vector<std::byte> result(static_cast<size_t>(count) * dtype_size(dtype));
    std::vector<const void*> inputs;
    for (auto& s : group_->slots) inputs.push_back(s.in);
    reduce_buffers(inputs, result.data(), count, dtype, op);
    rendezvous();
    if (count) std::memcpy(out, result.data(), result.size());
  }

  void all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    deposit(in, out, count, dtype, -1, "all_gather");
    rendezvous();
    check_same_counts("all_gather");
    size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    for (size_t r = 0; r < group_->slots.size(); ++r) {
      if (bytes) std::memcpy(static_cast<std::byte*>(out) + r * bytes, group_->slots[r].in, bytes);
    }
    rendezvous();
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    SW_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of a group of {}", root, size());
    deposit(buffer, buffer, count, dtype, root, "broadcast");
    rendezvous();
    check_same_counts("broadcast");
    for (size_t r = 0; r < group_->slots.size(); ++r) {
      SW_CHECK(group_->slots[r].root == root, "broadcast: rank {} uses root {} but rank {} uses root {}", rank_, root,
               r, group_->slots[r].root);
    }
    size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    if (rank_ != root && bytes) std::memcpy(buffer, group_->slots[static_cast<size_t>(root)].in, bytes);
    rendezvous();
  }

  void barrier() override {
    deposit(nullptr, nullptr, 0, DType::U8, -1, "barrier");
    rendezvous();
    check_same_counts("barrier");
    rendezvous();
  }

 private:
  Group::Slot& deposit(const void* in, void* out, int64_t count, DType dtype, int root, const char* op) {
    SW_CHECK(count >= 0, "{}: negative count {}", op, count);
    std::lock_guard lock(group_->mu);
    if (group_->slots.size() != group_->members.size()) group_->slots.resize(group_->members.size());
    Group::Slot& s = group_->slots[static_cast<size_t>(rank_)];
    s = {in, out, count, dtype, root, op};
    return s;
  }

  // Waits until every member has arrived at this point.
  void rendezvous() {
    Group& g = *group_;
    std::unique_lock lock(g.mu);
    uint64_t generation = g.generation;
    if (++g.arrived == static_cast<int>(g.members.size())) {
      g.arrived = 0;
      ++g.generation;
      g.cv.notify_all();
      return;
    }
    auto deadline = std::chrono::steady_clock::now() + world_->timeout();
    while (g.generation == generation) {
      if (world_->aborted()) {
        --g.arrived;
        fail("collective aborted on rank {}: {}", g.members[static_cast<size_t>(rank_)], world_->abort_reason());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        --g.arrived;
        fail("rank {} waited {} ms in a collective of group [{}] for ranks that never came",
             g.members[static_cast<size_t>(rank_)], world_->timeout().count(), fmt::join(g.members, ","));
      }
      g.cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  // Every rank checks every other rank's call: all of them throw the same Error on a mismatch.
  void check_same_counts(const char* op) {
    const auto& slots = group_->slots;
    const Group::Slot& a = slots[0];
    for (size_t r = 1; r < slots.size(); ++r) {
      const Group::Slot& b = slots[r];
      if (std::strcmp(a.op, b.op) != 0) {
        fail("collective mismatch: rank {} called {} while rank {} called {}", group_->members[0], a.op,
             group_->members[r], b.op);
      }
      if (a.count != b.count || a.dtype != b.dtype) {
        fail("{}: rank {} passes {} elements of {} but rank {} passes {} elements of {}", op, group_->members[0],
             a.count, dtype_name(a.dtype), group_->members[r], b.count, dtype_name(b.dtype));
      }
    }
  }

  std::shared_ptr<LocalWorld> world_;
  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::shared_ptr<LocalWorld> LocalWorld::create(int size, std::chrono::milliseconds timeout) {
  SW_CHECK(size >= 1, "a world needs at least one rank, got {}", size);
  return std::shared_ptr<LocalWorld>(new LocalWorld(size, timeout));
}

std::shared_ptr<LocalWorld::Group> LocalWorld::group_state(const std::vector<int>& members) {
  std::lock_guard lock(mu_);
  auto& g = groups_[members];
  if (!g) {
    g = std::make_shared<Group>();
    g->members = members;
  }
  return g;
}

std::shared_ptr<Communicator> LocalWorld::communicator(int rank) {
  SW_CHECK(rank >= 0 && rank < size_, "rank {} is outside a world of {}", rank, size_);
  std::vector<int> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) all[static_cast<size_t>(r)] = r;
  return std::make_shared<LocalComm>(shared_from_this(), group_state(all), rank);
}

void LocalWorld::abort(std::string reason) {
  std::lock_guard lock(mu_);
  if (!aborted_.load()) reason_ = std::move(reason);
  aborted_.store(true);
}

std::string LocalWorld::abort_reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

void LocalWorld::run(int size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  auto world = create(size, timeout);
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = world->communicator(r);
        fn(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        world->abort(fmt::format("rank {} failed: {}", r, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  // Report the rank that failed first (the abort reason), not the ranks it released.
  if (world->aborted()) throw Error(world->abort_reason());
}

}  // namespace shardwise::comm
