#pragma once
// A race check for device memory used from several streams (the fake device's, fake_device.h): each
// access to a byte range on a stream must come after the range's earlier accesses on other streams
// in CUDA's ordering, where a stream's work runs in order, a wait for an event orders the waiting
// stream after what the event's stream had queued when it was recorded, and a host synchronisation
// (or a completed event the host saw) orders everything queued afterwards, on any stream, after it.
// A read must follow the range's last write; a write must follow its last write and every read
// since. What breaks this is a race on a GPU (the CUDA streams are non-blocking: the default stream
// orders nothing either), reported once per pair of accesses (what, stream) with both named.
// Vector clocks: each stream counts its work; what a stream (and the host) knows of the others is a
// clock per stream.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace shardwise {

class StreamOrder {
 public:
  using StreamId = void*;  // Stream::handle (null: the default stream)

  // An access to [begin, begin + bytes) on `stream`; `what` names it in a report.
  void access(StreamId stream, uintptr_t begin, size_t bytes, bool write, const char* what);
  // The clock an event takes when recorded on `stream`.
  void record(StreamId stream, uint64_t event);
  // `stream` waits for `event` (recorded).
  void wait(StreamId stream, uint64_t event);
  // The host waited for `stream`, or saw `event` done.
  void synchronize(StreamId stream);
  void event_seen(uint64_t event);
  void release(uint64_t event);
  // Freed device memory: its accesses are forgotten (a new allocation is ordered by the allocator).
  void forget(uintptr_t begin, size_t bytes);

  const std::vector<std::string>& races() const { return races_; }
  void clear_races() { races_.clear(); }

 private:
  using Clock = std::map<StreamId, uint64_t>;
  struct Stamp {
    StreamId stream = nullptr;
    uint64_t tick = 0;
    const char* what = "";
  };
  struct Range {
    uintptr_t end = 0;
    Stamp write;              // tick 0: never written here
    std::vector<Stamp> reads;  // since the last write, one per stream
  };
  // The stream's clock: what it knows, joined with what the host knew when this work was queued.
  Clock& now(StreamId stream);
  bool ordered(const Stamp& earlier, const Clock& at) const;
  void check(const Stamp& earlier, const Stamp& later, uintptr_t begin, const Clock& at);
  // No range straddles `at` (one that did is two).
  void cut(uintptr_t at);
  // The ranges covering [begin, end) (gaps filled with fresh ones), split at its ends.
  std::vector<std::map<uintptr_t, Range>::iterator> split(uintptr_t begin, uintptr_t end);

  std::map<StreamId, Clock> streams_;
  Clock host_;
  std::map<uint64_t, Clock> events_;
  std::map<uintptr_t, Range> ranges_;  // by start, disjoint
  std::vector<std::string> races_;
  std::set<std::string> reported_;  // (earlier, later, their streams) already reported
};

}  // namespace shardwise
