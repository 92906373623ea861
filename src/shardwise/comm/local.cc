#include "shardwise/comm/local.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>

#include "shardwise/comm/call_check.h"
#include "shardwise/comm/local_moves.h"
#include "shardwise/comm/reduce_kernels.h"
#include "shardwise/core/error.h"
#include "shardwise/core/rank_failure.h"

namespace shardwise::comm {

struct LocalWorld::Group {
  std::vector<int> members;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  // A meeting inside a collective (LocalComm::meet): the first member that failed at the meeting
  // under way (global rank, its error; rank -1: none) and that of the last completed meeting.
  std::pair<int, std::string> failing{-1, ""}, failed{-1, ""};
  // What each member deposited for the current collective.
  struct Slot {
    const void* in = nullptr;
    void* out = nullptr;
    CallSignature call;
    std::span<const int64_t> counts;       // per-rank counts (v variants; all_to_all_v: send)
    std::span<const int64_t> recv_counts;  // all_to_all_v
    const Pieces* send_pieces = nullptr;   // all_to_all_pieces
    const std::byte* part = nullptr;       // all_reduce: the chunk this rank reduced
    // Device buffers (comm/device_buffers.h): the device's index (-1: host buffers) and, for each
    // device step of the call (LocalComm::device_step), the event after this rank's work of it.
    int device = -1;
    std::array<uint64_t, 3> events{};
  };
  static Slot slot(Collective op, const void* in, void* out, int64_t count, DType dtype, int root = -1,
                   Reduce reduce = Reduce::Sum) {
    Slot s;
    s.in = in, s.out = out, s.call = signature(op, count, dtype, reduce, root);
    return s;
  }
  std::vector<Slot> slots;
  // A receive posted before its message came (start_recv): the sender copies into `out` (outside
  // the lock: Claimed while it does) and marks it Done; `got` is the message's size when it is not
  // the `bytes` expected (nothing copied then).
  struct Posted {
    enum class State { Waiting, Claimed, Done };
    void* out = nullptr;
    size_t bytes = 0;
    State state = State::Waiting;
    int64_t got = -1;
    // Device receives: the receiver's device (-1: host) and the event after which `out` may be
    // written; `done` the event after the sender's copy; `sender_device` the sender's (its error).
    int device = -1;
    uint64_t ready = 0, done = 0;
    int sender_device = -1;
    // Delivers a message of `n` bytes from the sender's buffers at `from` (`in`: host or device
    // memory, device: queued on `from`'s stream after `ready`): copied into `out`, or (another size
    // or another kind of memory) only its size kept.
    void take(const void* in, size_t n, const Moves& from) {
      sender_device = from.device;
      if (from.device != device) [[unlikely]] return;
      if (n != bytes) got = static_cast<int64_t>(n);
      else if (!from.memory) std::memcpy(out, in, n);
      else done = from.copy_after(std::exchange(ready, 0), out, in, n);
    }
    // Delivers a message queued before the receive (at `to`, the receiver's memory).
    void take(Message& message, const Moves& to) {
      sender_device = message.device;
      if (message.device != device) [[unlikely]] return;
      if (message.size != bytes) {
        got = static_cast<int64_t>(message.size);
      } else if (!to.memory) {
        if (bytes) std::memcpy(out, message.bytes.data(), bytes);
      } else {
        done = to.copy_after(std::exchange(message.done, 0), out, message.bytes.data(), bytes);
        device_allocator(to.device_of()).record_use(message.bytes.device.device_ptr(), to.stream);
      }
      if (message.done) to.memory->release_event(message.done);
    }
  };
  // Point to point, per (source group rank, destination group rank, tag): the messages that came
  // before their receive, or the receives posted before their message (never both), in order.
  struct Channel {
    std::deque<Message> messages;
    std::deque<std::shared_ptr<Posted>> posted;
  };
  std::map<std::tuple<int, int, int>, Channel> channels;
  // shared_regions: every member's region (made and grown by member 0 while the others wait),
  // their size, and each member's count of its calls.
  std::vector<std::unique_ptr<std::byte[]>> region_memory;
  std::vector<std::byte*> regions;
  int64_t region_bytes = 0;
  std::vector<int64_t> region_calls;
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
    int index = group_index(global_ranks);
    std::vector<int> members(global_ranks.begin(), global_ranks.end());
    return std::make_shared<LocalComm>(world_, world_->group_state(members), index);
  }

  void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    // Each rank reduces one chunk of every input, in rank order, into a private buffer (peers may
    // still read our input if out == in); then every rank copies every chunk. Every element is
    // reduced once, by one rank, so all get the same bits. `part` outlives the collective's end.
    const Moves m = Moves::current();
    Scratch part;
    collective(Group::slot(Collective::AllReduce, in, out, count, dtype, -1, op), [&] {
      const int64_t n = size(), per = (count + n - 1) / n;
      const int64_t first = std::min(count, per * rank_), mine = std::min(count, first + per) - first;
      part.resize(m, bytes(mine, dtype));
      reduce_block(m, first, mine, dtype, op, part.data());
      group_->slots[static_cast<size_t>(rank_)].part = part.data();
      device_step(m);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t at = std::min(count, per * r), len = std::min(count, at + per) - at;
        if (len) m.copy(static_cast<std::byte*>(out) + bytes(at, dtype), group_->slots[static_cast<size_t>(r)].part, bytes(len, dtype));
      }
    }, m);
  }

  void reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) override {
    check_root("reduce", root);
    // The root reduces into a private buffer (its `out` may be its input) and copies it once the
    // collective has ended.
    const Moves m = Moves::current();
    Scratch result;
    collective(Group::slot(Collective::Reduce, in, out, count, dtype, root, op), [&] {
      if (rank_ != root) return;
      result.resize(m, bytes(count, dtype));
      reduce_block(m, 0, count, dtype, op, result.data());
    }, m);
    if (rank_ == root && count) m.copy(out, result.data(), bytes(count, dtype));
  }

  void all_gather(const void* in, void* out, int64_t count, DType dtype) override {
    const Moves m = Moves::current();
    collective(Group::slot(Collective::AllGather, in, out, count, dtype, -1), [&] {
      size_t b = bytes(count, dtype);
      for (size_t r = 0; r < group_->slots.size(); ++r) {
        if (b) m.copy(static_cast<std::byte*>(out) + r * b, group_->slots[r].in, b);
      }
    }, m);
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) override {
    check_counts("all_gather_v", counts);
    Group::Slot s = Group::slot(Collective::AllGatherV, in, out, counts[static_cast<size_t>(rank_)], dtype, -1);
    s.counts = counts;
    s.call.same_count = 0;
    const Moves m = Moves::current();
    collective(s, [&] {
      check_same_counts();
      size_t at = 0;
      for (size_t r = 0; r < group_->slots.size(); ++r) {
        size_t b = bytes(counts[r], dtype);
        if (b) m.copy(static_cast<std::byte*>(out) + at, group_->slots[r].in, b);
        at += b;
      }
    }, m);
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) override {
    const Moves m = Moves::current();
    collective(Group::slot(Collective::ReduceScatter, in, out, count, dtype, -1, op),
               [&] { reduce_block(m, count * rank_, count, dtype, op, out); }, m);
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype,
                        Reduce op) override {
    check_counts("reduce_scatter_v", counts);
    Group::Slot s = Group::slot(Collective::ReduceScatterV, in, out, sum_of(counts, counts.size()), dtype, -1, op);
    s.counts = counts;
    const Moves m = Moves::current();
    collective(s, [&] {
      check_same_counts();
      auto r = static_cast<size_t>(rank_);
      reduce_block(m, sum_of(counts, r), counts[r], dtype, op, out);
    }, m);
  }

  void all_to_all(const void* in, void* out, int64_t count, DType dtype) override {
    const Moves m = Moves::current();
    collective(Group::slot(Collective::AllToAll, in, out, count, dtype, -1), [&] {
      size_t b = bytes(count, dtype);
      for (size_t p = 0; p < group_->slots.size(); ++p) {
        if (b) m.copy(static_cast<std::byte*>(out) + p * b,
                      static_cast<const std::byte*>(group_->slots[p].in) + static_cast<size_t>(rank_) * b, b);
      }
    }, m);
  }

  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    check_counts("all_to_all_v (send counts)", send_counts);
    check_counts("all_to_all_v (receive counts)", recv_counts);
    const Moves m = Moves::current();
    all_to_all_collective(in, out, send_counts, recv_counts, nullptr, dtype, m, [&] {
      auto me = static_cast<size_t>(rank_);
      const auto& slots = group_->slots;
      size_t at = 0;
      for (size_t p = 0; p < slots.size(); ++p) {
        size_t b = bytes(recv_counts[p], dtype);
        size_t from = bytes(sum_of(slots[p].counts, me), dtype);
        if (b) m.copy(static_cast<std::byte*>(out) + at, static_cast<const std::byte*>(slots[p].in) + from, b);
        at += b;
      }
    });
  }

  // Each receiver copies straight from its peers' send pieces into its receive pieces.
  void all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                         const FillPieces& fill = {}) override {
    const std::vector<int64_t> send_counts = check_pieces("all_to_all_pieces (send)", send);
    const std::vector<int64_t> recv_counts = check_pieces("all_to_all_pieces (receive)", recv);
    fill_every_peer(*this, fill);  // the peers read every piece once all have met
    const Moves m = Moves::current();
    all_to_all_collective(in, out, send_counts, recv_counts, &send, dtype, m, [&] {
      const auto& slots = group_->slots;
      for (size_t p = 0; p < slots.size(); ++p) copy_pieces(m, *slots[p].send_pieces, slots[p].in, p, out, recv, dtype);
    });
  }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    check_root("broadcast", root);
    const Moves m = Moves::current();
    collective(Group::slot(Collective::Broadcast, buffer, buffer, count, dtype, root), [&] {
      size_t b = bytes(count, dtype);
      if (rank_ != root && b) m.copy(buffer, group_->slots[static_cast<size_t>(root)].in, b);
    }, m);
  }

  void send(const void* in, int64_t count, DType dtype, int peer, int tag) override {
    check_peer("send", peer);
    SW_CHECK(count >= 0, "send: negative count {}", count);
    Group& g = *group_;
    const size_t n = bytes(count, dtype);
    const Moves m = Moves::current();
    std::unique_lock lock(g.mu);
    Group::Channel& ch = g.channels[{rank_, peer, tag}];
    if (ch.posted.empty()) {
      lock.unlock();
      Message message;
      message.size = n, message.device = m.device;
      message.bytes.resize(m, n);
      if (m.memory) [[unlikely]] message.done = m.copy_after(0, message.bytes.data(), in, n);
      else if (n) std::memcpy(message.bytes.data(), in, n);
      lock.lock();
      if (ch.posted.empty()) {  // (a receive posted meanwhile takes the copy below)
        ch.messages.push_back(std::move(message));
        g.cv.notify_all();
        return;
      }
      if (message.done) m.memory->release_event(message.done);
    }
    std::shared_ptr<Group::Posted> to = ch.posted.front();
    ch.posted.pop_front();
    to->state = Group::Posted::State::Claimed;
    lock.unlock();
    to->take(in, n, m);
    const int receiver_device = to->device;
    lock.lock();
    to->state = Group::Posted::State::Done;
    g.cv.notify_all();
    lock.unlock();
    if (receiver_device != m.device) [[unlikely]] fail_memory("send", peer, m.device, receiver_device);
  }

  // The Error of a send and its receive of which one passed device buffers and the other not.
  [[noreturn]] void fail_memory(const char* what, int peer, int mine, int theirs) const {
    auto where = [](int d) { return d < 0 ? std::string("host buffers") : fmt::format("device buffers of cuda:{}", d); };
    fail("{} on rank {}: it passes {} and its peer, rank {}, {}", what, members()[static_cast<size_t>(rank_)],
         where(mine), members()[static_cast<size_t>(peer)], where(theirs));
  }

  void recv(void* out, int64_t count, DType dtype, int peer, int tag) override {
    start_recv(out, count, dtype, peer, tag)->wait();
  }

  std::unique_ptr<Request> start_send(const void* in, int64_t count, DType dtype, int peer, int tag) override {
    send(in, count, dtype, peer, tag);
    return std::make_unique<DoneRequest>();
  }

  std::unique_ptr<Request> start_recv(void* out, int64_t count, DType dtype, int peer, int tag) override;

  void barrier() override { collective(Group::slot(Collective::Barrier, nullptr, nullptr, 0, DType::U8, -1), [] {}); }

  // Plain memory of the process, one region a member (the threads share it), owned by the group:
  // a member that fails frees none of it. A growth is a barrier-like collective (every member is
  // done with the old regions) inside which member 0 replaces them.
  SharedRegions shared_regions(int64_t bytes) override {
    SW_CHECK(bytes >= 0, "shared_regions: negative size {}", bytes);
    Group& g = *group_;
    if (bytes > g.region_bytes || g.regions.empty()) {
      collective(Group::slot(Collective::Barrier, nullptr, nullptr, 0, DType::U8, -1), [&] {
        if (rank_ != 0) return;
        const int64_t grown = grown_region_bytes(bytes, g.region_bytes);
        std::vector<std::unique_ptr<std::byte[]>> memory;
        std::vector<std::byte*> regions;
        for (size_t r = 0; r < g.members.size(); ++r) {
          memory.push_back(std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(grown + kRegionAlign)));
          regions.push_back(aligned_region(memory.back().get()));
        }
        g.region_memory = std::move(memory), g.regions = std::move(regions), g.region_bytes = grown;
        g.region_calls.resize(g.members.size(), 0);
      });
    }
    return {g.regions, g.region_bytes, g.region_calls[static_cast<size_t>(rank_)]++};
  }
  void shared_barrier() override { barrier(); }

 private:
  static size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

  // One collective call: deposits this rank's `slot` and meets every member (the start: a rank
  // that leaves here, aborted or timed out, has let no peer read its buffers), checks that all
  // called alike, runs `body` (which reads the peers' buffers, and may meet them again with
  // step()), and meets them at the end before it returns or throws. A rank that fails in between
  // (a check, its body, a test hook) still meets the others, and the first meeting where a member
  // failed ends the collective for every member: the failed ones rethrow their error, the others
  // throw one naming the failed member and its error. So no member leaves, and frees the buffers
  // its slot points to, while a peer may still read them; the meetings inside ignore the world's
  // abort (every member is past the start, busy with its own copies, and comes).
  // Device buffers (`m`): the first device step is the call's start (an event after the work queued
  // before it, which every peer's stream waits for before reading this rank's buffers) and the last
  // follows `body` (this rank's stream goes on only after every peer's reads and writes of the call).
  template <class Body>
  void collective(const Group::Slot& slot, Body&& body, const Moves& m = {}) {
    const auto me = static_cast<size_t>(rank_);
    SW_CHECK(slot.call.count >= 0, "{}: negative count {}", collective_name(slot.call.op), slot.call.count);
    {
      std::lock_guard lock(group_->mu);
      if (group_->slots.size() != group_->members.size()) group_->slots.resize(group_->members.size());
      group_->slots[me] = slot;
      group_->slots[me].device = m.device;
    }
    DeviceSteps steps(m, group_->slots[me].events);
    if (m.memory) [[unlikely]] steps.record();
    rendezvous();
    std::exception_ptr error;
    std::string message;
    std::pair<int, std::string> failed{-1, ""};
    bool over = false;  // a meeting inside the body ended the collective
    try {
      if (world_->hooks().inside) world_->hooks().inside(group_->members[me], slot.call.op);
      std::vector<CallSignature> calls;
      for (const auto& s : group_->slots) calls.push_back(s.call);
      check_alike(calls, group_->members);  // every rank finds the same Error
      check_same_memory(slot.call.op);
      if (m.memory) [[unlikely]] wait_for_starts(m);
      body();
      if (m.memory) [[unlikely]] device_step(m);
    } catch (PeerFailed& f) {
      failed = {f.rank, std::move(f.message)}, over = true;
    } catch (const std::exception& e) {
      error = std::current_exception(), message = e.what();
    } catch (...) {
      error = std::current_exception(), message = "an exception that is not a std::exception";
    }
    if (!over) failed = meet(error ? &message : nullptr);
    if (error) std::rethrow_exception(error);
    if (failed.first >= 0) {
      fail("{} on rank {}: rank {} failed inside it: {}", collective_name(slot.call.op), group_->members[me],
           failed.first, failed.second);
    }
  }

  // A meeting inside a collective's body; when a peer failed at it, the collective is over.
  struct PeerFailed {
    int rank;
    std::string message;
  };
  void step() {
    auto [rank, message] = meet(nullptr);
    if (rank >= 0) throw PeerFailed{rank, std::move(message)};
  }

  // A meeting inside a collective that, on device buffers, also orders the ranks' streams: this
  // rank's event after its work so far, then its stream waits for every peer's (so a peer's later
  // work on its buffers comes after this rank's reads of them, and this rank reads what they wrote).
  void device_step(const Moves& m) {
    if (!m.memory) return step();
    auto& mine = group_->slots[static_cast<size_t>(rank_)];
    const size_t k = DeviceSteps::record_next(m, mine.events);
    step();
    for (size_t p = 0; p < group_->slots.size(); ++p) {
      if (p != static_cast<size_t>(rank_)) m.memory->wait_event(m.stream, group_->slots[p].events[k]);
    }
  }

  // Every rank passes host buffers, or device buffers of one device: an Error naming both ranks
  // otherwise (the same on every rank).
  void check_same_memory(Collective op) {
    const auto& slots = group_->slots;
    for (size_t p = 1; p < slots.size(); ++p) {
      if (slots[p].device != slots[0].device) {
        auto where = [](int d) { return d < 0 ? std::string("host buffers") : fmt::format("device buffers of cuda:{}", d); };
        fail("{}: rank {} passes {} and rank {} {} (the threads backend moves device buffers between ranks on one "
             "device)",
             collective_name(op), group_->members[0], where(slots[0].device), group_->members[p], where(slots[p].device));
      }
    }
  }

  // Device buffers: this rank's stream waits for every peer's start.
  void wait_for_starts(const Moves& m) {
    const auto& slots = group_->slots;
    for (size_t p = 0; p < slots.size(); ++p) {
      if (p != static_cast<size_t>(rank_)) m.memory->wait_event(m.stream, slots[p].events[0]);
    }
  }

  // Waits until every member has arrived at this meeting inside a collective, without a timeout or
  // the world's abort (see collective()). `failure`: this rank's error (null: none). Returns the
  // first failed member of the meeting and its error (rank -1: none failed).
  std::pair<int, std::string> meet(const std::string* failure) {
    Group& g = *group_;
    const int me = g.members[static_cast<size_t>(rank_)];
    std::unique_lock lock(g.mu);
    if (failure && g.failing.first < 0) g.failing = {me, *failure};
    const uint64_t generation = g.generation;
    if (++g.arrived == static_cast<int>(g.members.size())) {
      g.arrived = 0, ++g.generation;
      g.failed = std::exchange(g.failing, {-1, ""});
      g.cv.notify_all();
    } else {
      while (g.generation == generation) {
        if (world_->hooks().waiting) world_->hooks().waiting(me);
        g.cv.wait(lock);
      }
    }
    return g.failed;  // no later meeting completes before this member arrives at it
  }

  // Reduction of the elements [offset, offset + count) of every rank's input, in rank order.
  void reduce_block(const Moves& m, int64_t offset, int64_t count, DType dtype, Reduce op, void* out) {
    std::vector<const void*> inputs;
    for (auto& s : group_->slots) inputs.push_back(static_cast<const std::byte*>(s.in) + bytes(offset, dtype));
    if (count) m.reduce(inputs, out, count, dtype, op);
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

  // The start of a collective: waits until every member has arrived, or fails when the world is
  // aborted or the members do not all come within the timeout (this rank then no longer counts as
  // arrived, so no member starts the collective without it).
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

  // An all_to_all_v (or all_to_all_pieces) with its counts deposited; every rank checks the whole
  // matrix, so all of them raise the same Error, before `body`.
  template <class Body>
  void all_to_all_collective(const void* in, void* out, std::span<const int64_t> send_counts,
                             std::span<const int64_t> recv_counts, const Pieces* pieces, DType dtype, const Moves& m,
                             Body&& body) {
    Group::Slot s = Group::slot(pieces ? Collective::AllToAllPieces : Collective::AllToAllV, in, out, 0, dtype, -1);
    s.counts = send_counts;
    s.recv_counts = recv_counts;
    s.send_pieces = pieces;
    collective(s, [&] {
      const auto& slots = group_->slots;
      for (size_t q = 0; q < slots.size(); ++q) {
        for (size_t p = 0; p < slots.size(); ++p) {
          if (slots[q].counts[p] != slots[p].recv_counts[q]) {
            fail_all_to_all_counts(group_->members[q], slots[q].counts[p], group_->members[p], slots[p].recv_counts[q],
                                   s.call.op);
          }
        }
      }
      body();
    }, m);
  }

  // all_to_all_pieces: what peer `p` sends this rank (its pieces `from` of its buffer `in`) into
  // this rank's receive pieces `recv` of `out`.
  void copy_pieces(const Moves& m, const Pieces& from, const void* in, size_t p, void* out, const Pieces& recv,
                   DType dtype) const {
    const auto me = static_cast<size_t>(rank_);
    const auto* src = static_cast<const std::byte*>(in);
    auto i = static_cast<size_t>(from.first[me]), j = static_cast<size_t>(recv.first[p]);
    int64_t used_i = 0, used_j = 0;  // elements of piece i (sent) and j (received) already copied
    while (i < static_cast<size_t>(from.first[me + 1]) && j < static_cast<size_t>(recv.first[p + 1])) {
      const int64_t n = std::min(from.count[i] - used_i, recv.count[j] - used_j);
      if (n) {
        m.copy(static_cast<std::byte*>(out) + bytes(recv.offset[j] + used_j, dtype),
               src + bytes(from.offset[i] + used_i, dtype), bytes(n, dtype));
      }
      used_i += n, used_j += n;
      if (used_i == from.count[i]) ++i, used_i = 0;
      if (used_j == recv.count[j]) ++j, used_j = 0;
    }
  }

  void check_same_counts() {
    std::vector<std::span<const int64_t>> counts;
    for (const auto& s : group_->slots) counts.push_back(s.counts);
    comm::check_same_counts(group_->slots[0].call.op, counts, group_->members);
  }

  std::shared_ptr<LocalWorld> world_;
  std::shared_ptr<Group> group_;
  int rank_;

  friend class RecvRequest;
};

// A receive posted in its channel (LocalComm::start_recv); the communicator outlives it.
class RecvRequest final : public Request {
 public:
  RecvRequest(LocalComm& comm, std::shared_ptr<Group::Posted> posted, Group::Channel& channel, int64_t count,
              DType dtype, int peer, int tag, const Moves& m)
      : comm_(comm), posted_(std::move(posted)), channel_(channel), count_(count), dtype_(dtype), peer_(peer), tag_(tag),
        m_(m) {}
  // Unwinding without a wait: the receive leaves its channel, or (a sender copying into it) is
  // waited for, so no sender writes into a freed buffer.
  ~RecvRequest() override {
    if (!posted_) return;
    std::unique_lock lock(comm_.group_->mu);
    withdraw(lock);
  }
  void wait() override {
    if (!posted_) return;
    Group& g = *comm_.group_;
    std::unique_lock lock(g.mu);
    try {
      comm_.wait(lock, [&] { return posted_->state != Group::Posted::State::Waiting; }, "recv");
    } catch (...) {
      withdraw(lock);
      throw;
    }
    g.cv.wait(lock, [&] { return posted_->state == Group::Posted::State::Done; });  // a copy under way ends
    const int64_t got = posted_->got;
    const size_t want = posted_->bytes;
    if (m_.memory) [[unlikely]] {  // this stream goes on after the sender's copy
      if (posted_->done) m_.memory->wait_event(m_.stream, posted_->done), m_.memory->release_event(posted_->done);
      if (posted_->ready) m_.memory->release_event(posted_->ready);  // (no copy came)
    }
    const int sender_device = posted_->sender_device;
    posted_.reset();
    if (sender_device != m_.device) [[unlikely]] comm_.fail_memory("recv", peer_, m_.device, sender_device);
    if (got >= 0) {
      fail_recv_size(g.members[static_cast<size_t>(comm_.rank_)], count_, dtype_, static_cast<int64_t>(want),
                     g.members[static_cast<size_t>(peer_)], tag_, got);
    }
  }
  bool test() override {
    if (!posted_) return true;
    std::lock_guard lock(comm_.group_->mu);
    return posted_->state == Group::Posted::State::Done;
  }

 private:
  void withdraw(std::unique_lock<std::mutex>& lock) {
    auto& q = channel_.posted;
    if (auto it = std::find(q.begin(), q.end(), posted_); it != q.end()) q.erase(it);
    comm_.group_->cv.wait(lock, [&] { return posted_->state != Group::Posted::State::Claimed; });
    posted_.reset();
  }
  LocalComm& comm_;
  std::shared_ptr<Group::Posted> posted_;  // null once waited for
  Group::Channel& channel_;                // (a std::map node: stays put)
  int64_t count_;
  DType dtype_;
  int peer_, tag_;
  Moves m_;  // the receive's memory
};

// A message already queued is taken at once (its size Error left to the wait); otherwise the
// receive waits in its channel.
std::unique_ptr<Request> LocalComm::start_recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  check_peer("recv", peer);
  SW_CHECK(count >= 0, "recv: negative count {}", count);
  Group& g = *group_;
  auto posted = std::make_shared<Group::Posted>();
  posted->out = out, posted->bytes = bytes(count, dtype);
  const Moves m = Moves::current();
  posted->device = m.device;
  if (m.memory) [[unlikely]] posted->ready = m.memory->record_event(m.stream);
  std::unique_lock lock(g.mu);
  Group::Channel& ch = g.channels[{peer, rank_, tag}];
  if (ch.messages.empty()) {
    ch.posted.push_back(posted);
  } else {
    Message message = std::move(ch.messages.front());
    ch.messages.pop_front();
    lock.unlock();
    posted->take(message, m);
    posted->state = Group::Posted::State::Done;
  }
  return std::make_unique<RecvRequest>(*this, std::move(posted), ch, count, dtype, peer, tag, m);
}

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

void LocalWorld::abort(std::string reason, ErrorKind kind) {
  {
    std::lock_guard lock(mu_);
    if (!aborted_.load()) reason_ = std::move(reason), kind_ = kind;
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
      } catch (const RankFailure& e) {  // the agreed error already names the rank where it arose
        world->abort(e.what(), error_kind(e));
      } catch (const std::exception& e) {
        world->abort(fmt::format("rank {} failed: {}", r, e.what()), error_kind(e));
      }
    });
  }
  for (auto& t : threads) t.join();
  // Report the rank that failed first (the abort reason), not the ranks it released.
  // A kind-less error stays a plain Error, so a caller's raising() can still give it the call's kind.
  if (world->aborted() && world->kind_ == ErrorKind::General) throw Error(world->abort_reason());
  if (world->aborted()) throw KindedError(world->kind_, world->abort_reason());
}

}  // namespace shardwise::comm
