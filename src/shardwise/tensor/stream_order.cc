#include "shardwise/tensor/stream_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace shardwise {

namespace {

constexpr size_t kMostReports = 64;

void join(std::map<void*, uint64_t>& into, const std::map<void*, uint64_t>& from) {
  for (const auto& [stream, tick] : from) {
    uint64_t& t = into[stream];
    t = std::max(t, tick);
  }
}

std::string stream_name(void* s) { return s == nullptr ? std::string("default") : fmt::format("{}", s); }

}  // namespace

StreamOrder::Clock& StreamOrder::now(StreamId stream) {
  Clock& c = streams_[stream];
  join(c, host_);
  return c;
}

bool StreamOrder::ordered(const Stamp& earlier, const Clock& at) const {
  if (earlier.tick == 0) return true;
  const auto it = at.find(earlier.stream);
  return it != at.end() && it->second >= earlier.tick;
}

void StreamOrder::check(const Stamp& earlier, const Stamp& later, uintptr_t begin, const Clock& at) {
  if (ordered(earlier, at) || races_.size() >= kMostReports) return;
  const std::string key = fmt::format("{}|{}|{}|{}", earlier.what, later.what, earlier.stream, later.stream);
  if (!reported_.insert(key).second) return;
  races_.push_back(fmt::format("{} on stream {} at device address {:#x} races {} on stream {}: no event or host "
                               "wait orders them",
                               later.what, stream_name(later.stream), begin, earlier.what,
                               stream_name(earlier.stream)));
  // To find the code of a race: run under a debugger with this set, and read the stack.
  if (std::getenv("SHARDWISE_STREAM_RACE_ABORT") != nullptr) std::abort();
}

void StreamOrder::cut(uintptr_t at) {
  auto it = ranges_.upper_bound(at);
  if (it == ranges_.begin()) return;
  --it;
  if (it->first == at || it->second.end <= at) return;
  Range right = it->second;
  it->second.end = at;
  ranges_.emplace(at, std::move(right));
}

std::vector<std::map<uintptr_t, StreamOrder::Range>::iterator> StreamOrder::split(uintptr_t begin, uintptr_t end) {
  cut(begin);
  cut(end);
  uintptr_t pos = begin;
  for (auto it = ranges_.lower_bound(begin); it != ranges_.end() && it->first < end; ++it) {
    if (it->first > pos) ranges_.emplace(pos, Range{.end = it->first});
    pos = it->second.end;
  }
  if (pos < end) ranges_.emplace(pos, Range{.end = end});
  std::vector<std::map<uintptr_t, Range>::iterator> out;
  for (auto it = ranges_.lower_bound(begin); it != ranges_.end() && it->first < end; ++it) out.push_back(it);
  return out;
}

void StreamOrder::access(StreamId stream, uintptr_t begin, size_t bytes, bool write, const char* what) {
  if (bytes == 0) return;
  Clock& at = now(stream);
  const Stamp s{stream, ++at[stream], what};
  for (auto it : split(begin, begin + bytes)) {
    Range& r = it->second;
    check(r.write, s, it->first, at);
    if (write) {
      for (const Stamp& read : r.reads) check(read, s, it->first, at);
      r.write = s;
      r.reads.clear();
      continue;
    }
    auto mine = std::find_if(r.reads.begin(), r.reads.end(), [&](const Stamp& x) { return x.stream == stream; });
    if (mine == r.reads.end()) r.reads.push_back(s);
    else *mine = s;
  }
}

void StreamOrder::record(StreamId stream, uint64_t event) { events_[event] = now(stream); }

void StreamOrder::wait(StreamId stream, uint64_t event) {
  const auto it = events_.find(event);
  if (it != events_.end()) join(now(stream), it->second);
}

void StreamOrder::synchronize(StreamId stream) { join(host_, now(stream)); }

void StreamOrder::event_seen(uint64_t event) {
  const auto it = events_.find(event);
  if (it != events_.end()) join(host_, it->second);
}

void StreamOrder::release(uint64_t event) { events_.erase(event); }

void StreamOrder::forget(uintptr_t begin, size_t bytes) {
  cut(begin);
  cut(begin + bytes);
  ranges_.erase(ranges_.lower_bound(begin), ranges_.lower_bound(begin + bytes));
}

}  // namespace shardwise
