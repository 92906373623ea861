#include "shardwise/comm/local.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <tuple>

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
    Reduce reduce = Reduce::Sum;
    std::span<const int64_t> counts;       // per-rank counts (v variants; all_to_all_v: send)
    std::span<const int64_t> recv_counts;  // all_to_all_v
  };
  static Slot slot(const char* op, const void* in, void* out, int64_t count, DType dtype, int root = -1,
                   Reduce reduce = Reduce::Sum) {
    Slot s;
    s.in = in, s.out = out, s.count = count, s.dtype = dtype, s.root = root, s.op = op, s.reduce = reduce;
    return s;
  }
  std::vector<Slot> slots;
  // Point-to-point messages in flight: (source group rank, destination group rank, tag) -> queue.
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mailbox;
};

namespace {

using Group = LocalWorld::Group;

int64_t sum_of(std::span<const int64_t> counts, size_t end) {
  int64_t s = 0;
  for (size_t i = 0; i < end; ++i) s += counts[i];
  return s;
}

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalWorld> world, std::shared_ptr<LocalWorld::Group> group, int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}

  std::string_view backend() const override { return "local"; }
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
      SW_CHECK(std::count(members.begin(), members.end(), members[i]) == 1, "group: rank {} is listed twice",
               members[i]);
      if (members[i] == me) index = static_cast<int>(i);
    }
    SW_CHECK(index >= 0, "group: rank {} asked for a group it is not in", me);
    return std::make_shared<LocalComm>(world_, world_->group_state(members), index);
  }

  void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    Group::Slot s = Group::slot("all_reduce", in, out, count, dtype, -1, op);
    enter(s);
    // Reduce in rank order into a private buffer: peers may still read our input if out == in.
    std::vector<std::byte> result(bytes(count, dtype));
    reduce_block(0, count, dtype, op, result.data());
    rendezvous();
    if (count) std::memcpy(out, result.data(), result.size());
  }

  void reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) override {
    check_root("reduce", root);
    Group::Slot s = Group::slot("reduce", in, out, count, dtype, root, op);
    enter(s);
    if (rank_ == root) {
      std::vector<std::byte> result(bytes(count, dtype));
      reduce_block(0, count, dtype, op, result.data());
      rendezvous();
      if (count) std::memcpy(out, result.data(), result.size());
    } else {
      rendezvous();
    }
  }

  void all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    enter(Group::slot("all_gather", in, out, count, dtype, -1));
    size_t b = bytes(count, dtype);
    for (size_t r = 0; r < group_->slots.size(); ++r) {
      if (b) std::memcpy(static_cast<std::byte*>(out) + r * b, group_->slots[r].in, b);
    }
    rendezvous();
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) override {
    check_counts("all_gather_v", counts);
    Group::Slot s = Group::slot("all_gather_v", in, out, counts[static_cast<size_t>(rank_)], dtype, -1);
    s.counts = counts;
    enter(s, /*same_count=*/false);
    check_same_vectors("all_gather_v", "counts", &Group::Slot::counts);
    size_t at = 0;
    for (size_t r = 0; r < group_->slots.size(); ++r) {
      size_t b = bytes(counts[r], dtype);
      if (b) std::memcpy(static_cast<std::byte*>(out) + at, group_->slots[r].in, b);
      at += b;
    }
    rendezvous();
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    enter(Group::slot("reduce_scatter", in, out, count, dtype, -1, op));
    reduce_block(count * rank_, count, dtype, op, out);
    rendezvous();
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype,
                        Reduce op) override {
    check_counts("reduce_scatter_v", counts);
    Group::Slot s = Group::slot("reduce_scatter_v", in, out, sum_of(counts, counts.size()), dtype, -1, op);
    s.counts = counts;
    enter(s);
    check_same_vectors("reduce_scatter_v", "counts", &Group::Slot::counts);
    auto r = static_cast<size_t>(rank_);
    reduce_block(sum_of(counts, r), counts[r], dtype, op, out);
    rendezvous();
  }

  void all_to_all(const void* in, void* out, int64_t count, DType dtype) override {
    enter(Group::slot("all_to_all", in, out, count, dtype, -1));
    size_t b = bytes(count, dtype);
    for (size_t p = 0; p < group_->slots.size(); ++p) {
      if (b) std::memcpy(static_cast<std::byte*>(out) + p * b,
                         static_cast<const std::byte*>(group_->slots[p].in) + static_cast<size_t>(rank_) * b, b);
    }
    rendezvous();
  }

  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    check_counts("all_to_all_v (send counts)", send_counts);
    check_counts("all_to_all_v (receive counts)", recv_counts);
    Group::Slot s = Group::slot("all_to_all_v", in, out, 0, dtype, -1);
    s.counts = send_counts;
    s.recv_counts = recv_counts;
    enter(s);
    // Every rank checks the whole matrix, so all of them raise the same Error.
    const auto& slots = group_->slots;
    for (size_t q = 0; q < slots.size(); ++q) {
      for (size_t p = 0; p < slots.size(); ++p) {
        if (slots[q].counts[p] != slots[p].recv_counts[q]) {
          fail("all_to_all_v: rank {} sends {} elements to rank {}, but rank {} expects {} from rank {}",
               group_->members[q], slots[q].counts[p], group_->members[p], group_->members[p],
               slots[p].recv_counts[q], group_->members[q]);
        }
      }
    }
    auto me = static_cast<size_t>(rank_);
    size_t at = 0;
    for (size_t p = 0; p < slots.size(); ++p) {
      size_t b = bytes(recv_counts[p], dtype);
      size_t from = bytes(sum_of(slots[p].counts, me), dtype);
      if (b) std::memcpy(static_cast<std::byte*>(out) + at, static_cast<const std::byte*>(slots[p].in) + from, b);
      at += b;
    }
    rendezvous();
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    check_root("broadcast", root);
    enter(Group::slot("broadcast", buffer, buffer, count, dtype, root));
    size_t b = bytes(count, dtype);
    if (rank_ != root && b) std::memcpy(buffer, group_->slots[static_cast<size_t>(root)].in, b);
    rendezvous();
  }

  void send(const void* in, int64_t count, DType dtype, int peer, int tag) override {
    check_peer("send", peer);
    SW_CHECK(count >= 0, "send: negative count {}", count);
    std::vector<std::byte> message(bytes(count, dtype));
    if (!message.empty()) std::memcpy(message.data(), in, message.size());
    std::lock_guard lock(group_->mu);
    group_->mailbox[{rank_, peer, tag}].push_back(std::move(message));
    group_->cv.notify_all();
  }

  void recv(void* out, int64_t count, DType dtype, int peer, int tag) override {
    check_peer("recv", peer);
    SW_CHECK(count >= 0, "recv: negative count {}", count);
    Group& g = *group_;
    std::unique_lock lock(g.mu);
    auto key = std::make_tuple(peer, rank_, tag);
    wait(lock, [&] {
      auto it = g.mailbox.find(key);
      return it != g.mailbox.end() && !it->second.empty();
    }, "recv");
    auto it = g.mailbox.find(key);
    std::vector<std::byte> message = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) g.mailbox.erase(it);
    size_t want = bytes(count, dtype);
    SW_CHECK(message.size() == want,
             "recv: rank {} expects {} elements of {} ({} bytes) from rank {} (tag {}), but the message has {} bytes",
             g.members[static_cast<size_t>(rank_)], count, dtype_name(dtype), want, g.members[static_cast<size_t>(peer)],
             tag, message.size());
    if (want) std::memcpy(out, message.data(), want);
  }

  void barrier() override {
    enter(Group::slot("barrier", nullptr, nullptr, 0, DType::U8, -1));
    rendezvous();
  }

 private:
  static size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

  // Deposits this rank's call, waits for every member, and checks that all called alike.
  void enter(const Group::Slot& slot, bool same_count = true) {
    SW_CHECK(slot.count >= 0, "{}: negative count {}", slot.op, slot.count);
    {
      std::lock_guard lock(group_->mu);
      if (group_->slots.size() != group_->members.size()) group_->slots.resize(group_->members.size());
      group_->slots[static_cast<size_t>(rank_)] = slot;
    }
    rendezvous();
    check_alike(same_count);
  }

  // Reduction of the elements [offset, offset + count) of every rank's input, in rank order.
  void reduce_block(int64_t offset, int64_t count, DType dtype, Reduce op, void* out) {
    std::vector<const void*> inputs;
    for (auto& s : group_->slots) inputs.push_back(static_cast<const std::byte*>(s.in) + bytes(offset, dtype));
    if (count) reduce_buffers(inputs, out, count, dtype, op);
  }

  template <class Ready>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready, const char* what) {
    Group& g = *group_;
    auto deadline = std::chrono::steady_clock::now() + world_->timeout();
    while (!ready()) {
      if (world_->aborted()) {
        fail("{} aborted on rank {}: {}", what, g.members[static_cast<size_t>(rank_)], world_->abort_reason());
      }
      if (std::chrono::steady_clock::now() > deadline) {
        fail("rank {} waited {} ms in {} of group [{}] for ranks that never came", g.members[static_cast<size_t>(rank_)],
             world_->timeout().count(), what, fmt::join(g.members, ","));
      }
      g.cv.wait_for(lock, std::chrono::milliseconds(20));
    }
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
    try {
      wait(lock, [&] { return g.generation != generation; }, "a collective");
    } catch (...) {
      --g.arrived;
      throw;
    }
  }

  // Every rank checks every other rank's call: all of them throw the same Error on a mismatch.
  void check_alike(bool same_count) {
    const auto& slots = group_->slots;
    const auto& members = group_->members;
    const Group::Slot& a = slots[0];
    for (size_t r = 1; r < slots.size(); ++r) {
      const Group::Slot& b = slots[r];
      if (std::strcmp(a.op, b.op) != 0) {
        fail("collective mismatch: rank {} called {} while rank {} called {}", members[0], a.op, members[r], b.op);
      }
      if ((same_count && a.count != b.count) || a.dtype != b.dtype) {
        fail("{}: rank {} passes {} elements of {} but rank {} passes {} elements of {}", a.op, members[0], a.count,
             dtype_name(a.dtype), members[r], b.count, dtype_name(b.dtype));
      }
      if (a.root != b.root) {
        fail("{}: rank {} uses root {} but rank {} uses root {}", a.op, members[0], a.root, members[r], b.root);
      }
      if (a.reduce != b.reduce) {
        fail("{}: rank {} reduces with {} but rank {} with {}", a.op, members[0], reduce_name(a.reduce), members[r],
             reduce_name(b.reduce));
      }
    }
  }

  void check_same_vectors(const char* op, const char* what, std::span<const int64_t> Group::Slot::*field) {
    const auto& slots = group_->slots;
    for (size_t r = 1; r < slots.size(); ++r) {
      auto a = slots[0].*field, b = slots[r].*field;
      if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) {
        fail("{}: rank {} passes {} [{}] but rank {} passes [{}]", op, group_->members[0], what, fmt::join(a, ","),
             group_->members[r], fmt::join(b, ","));
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
  {
    std::lock_guard lock(mu_);
    if (!aborted_.load()) reason_ = std::move(reason);
    aborted_.store(true);
  }
  // Wake every waiter now rather than at its next poll.
  std::vector<std::shared_ptr<Group>> groups;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, g] : groups_) groups.push_back(g);
  }
  for (auto& g : groups) {
    std::lock_guard lock(g->mu);
    g->cv.notify_all();
  }
}

std::string LocalWorld::abort_reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

void LocalWorld::run(int size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  auto world = create(size, timeout);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = world->communicator(r);
        fn(*comm);
      } catch (const std::exception& e) {
        world->abort(fmt::format("rank {} failed: {}", r, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  // Report the rank that failed first (the abort reason), not the ranks it released.
  if (world->aborted()) throw Error(world->abort_reason());
}

}  // namespace shardwise::comm
