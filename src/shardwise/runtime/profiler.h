#pragma once
// `shardwise train --profile`: where a step goes. Each rank thread (or MPI process) records into its
// own RankProfile, made current for the thread by ActiveProfile; code that can be profiled asks
// active_profile() (a thread-local pointer: null, the default, means off and costs one check).
// Recorded: the step (and evaluation) as top-level events, each instruction the Runtime runs
// (op kernel, gradient kernel, fill, reshard), each collective call through a ProfiledCommunicator
// (profiled_comm.h), the optimizer update, and per step the thread's page faults (getrusage
// RUSAGE_THREAD). Totals per event type are kept as events are recorded (independently of the
// event list). gather_profile (collective) brings every rank's events and totals to rank 0, which
// writes one Chrome trace-event file (Perfetto opens it: one track per rank) and prints a table.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/tensor/device.h"

namespace shardwise::runtime {

enum class EventKind : uint8_t { Step, Eval, Op, Fill, Reshard, Collective, Optimizer };
std::string_view event_kind_name(EventKind k);  // the trace's "cat": "step", "op", ...

// Texts are interned per RankProfile (RankProfile::intern / text): an event is a few numbers.
struct ProfileEvent {
  EventKind kind = EventKind::Op;
  int32_t name = -1;    // op type ("matmul", "matmul_grad"), collective ("all_reduce"), "step 3", ...
  int32_t detail = -1;  // op: node and operand shapes; reshard: the distributions; an all_to_all
                        // through shared memory: "shared memory" (-1: none)
  int64_t start_ns = 0, dur_ns = 0;  // from the profile's origin
  int64_t bytes = 0;    // collectives: this rank's bytes (sent, or received by recv); reshards: output bytes
  int64_t minflt = -1, majflt = -1;  // steps: page faults of the rank's thread during the step
};

struct TypeTotal {
  int64_t count = 0, ns = 0, bytes = 0;
};

class RankProfile {
 public:
  explicit RankProfile(int rank);
  int rank() const { return rank_; }
  // The device a device run keeps its tensors on: the summary's allocator line is its allocator's
  // (the host's otherwise).
  void set_device(Device device) { device_ = device; }
  Device device() const { return device_; }
  uint64_t serial() const { return serial_; }  // unique in the process (caches of interned ids key on it)
  // Collective: every rank agrees on the time origin (the earliest rank's steady clock now).
  void start(comm::Communicator& world);
  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count() -
           origin_ns_;
  }
  int32_t intern(std::string_view text);
  const std::string& text(int32_t id) const { return texts_[static_cast<size_t>(id)]; }
  const std::vector<std::string>& texts() const { return texts_; }
  void record(const ProfileEvent& e);
  const std::deque<ProfileEvent>& events() const { return events_; }
  // Per "kind name" (e.g. "op matmul", "collective all_reduce"; "step", "reshard"): count, time, bytes.
  std::map<std::string, TypeTotal> totals() const;

 private:
  int rank_;
  Device device_;
  uint64_t serial_;
  int64_t origin_ns_ = 0;
  std::deque<ProfileEvent> events_;  // grows without moving what it holds
  std::vector<std::string> texts_;
  std::unordered_map<std::string, int32_t> ids_;
  std::map<std::pair<EventKind, int32_t>, TypeTotal> totals_;  // kept as events are recorded
};

// The calling thread's profile (null: profiling off).
RankProfile* active_profile();

// Makes `p` current for this thread while it lives (null: leaves profiling off).
class ActiveProfile {
 public:
  explicit ActiveProfile(RankProfile* p);
  ~ActiveProfile();
  ActiveProfile(const ActiveProfile&) = delete;
  ActiveProfile& operator=(const ActiveProfile&) = delete;

 private:
  RankProfile* previous_;
};

// Records one event from construction to destruction into `p` (the first form: the thread's
// active profile); nothing when it is null. Steps and evaluations also record the thread's page
// faults during them. A non-empty `detail` becomes the event's detail (the trace's args.detail).
class ProfileScope {
 public:
  ProfileScope(EventKind kind, std::string_view name, int64_t bytes = 0, std::string_view detail = {})
      : ProfileScope(active_profile(), kind, name, bytes, detail) {}
  ProfileScope(RankProfile* p, EventKind kind, std::string_view name, int64_t bytes = 0, std::string_view detail = {});
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  RankProfile* p_;
  ProfileEvent e_;
};

struct RankSummary {
  int rank = 0;
  std::map<std::string, TypeTotal> totals;
  std::vector<int64_t> step_minflt, step_majflt;  // per step, in order
  int64_t reserved_bytes = 0, peak_in_use_bytes = 0, cached_bytes = 0, in_use_bytes = 0;  // allocator_stats()
  std::string device;  // the device whose allocator those are ("" : the host's)
};

struct ProfileReport {
  std::vector<RankSummary> ranks;              // in rank order
  std::vector<std::vector<ProfileEvent>> events;  // per rank
  std::vector<std::vector<std::string>> texts;    // per rank: its events' names and details
  bool one_process = true;                     // ranks are threads of one process (one allocator)
};

// Collective over `world`: rank 0 gets every rank's events and totals (others get an empty report).
ProfileReport gather_profile(const RankProfile& p, comm::Communicator& world);
// Chrome trace-event JSON (traceEvents: "M" names per rank track, "X" complete events).
void write_chrome_trace(const ProfileReport& r, const std::string& path);
// The end-of-run table: time per event type, GEMM share, collectives, allocator and page faults.
std::string format_profile(const ProfileReport& r);

}  // namespace shardwise::runtime
