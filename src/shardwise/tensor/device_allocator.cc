#include "shardwise/tensor/device_allocator.h"

#include <algorithm>
#include <bit>

#include "shardwise/core/error.h"

namespace shardwise {

namespace {
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeFrom = size_t{1} << 20;
}  // namespace

size_t DeviceAllocator::size_class(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes < kLargeFrom) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  const size_t step = std::bit_floor(bytes) / 4;
  return (bytes + step - 1) / step * step;
}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void* DeviceAllocator::take_cached(size_t size, Stream stream) {
  auto it = cached_.find({stream.handle, size});
  if (it == cached_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  stats_.cached_bytes -= static_cast<int64_t>(size);
  return ptr;
}

void* DeviceAllocator::allocate(size_t bytes, Stream stream) {
  const size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  ++stats_.allocations;
  collect_pending();
  void* ptr = take_cached(size, stream);
  if (ptr != nullptr) {
    ++stats_.hits;
  } else {
    ptr = memory_.allocate(size);
    if (ptr == nullptr) {
      release_cached_locked();
      ptr = memory_.allocate(size);
    }
    SW_CHECK(ptr != nullptr, "{} is out of memory: {} bytes asked for ({} in use, cache emptied)",
             memory_.device().to_string(), size, stats_.in_use_bytes);
    ++stats_.device_allocations;
    stats_.reserved_bytes += static_cast<int64_t>(size);
  }
  live_[ptr] = Block{size, stream, {}};
  stats_.in_use_bytes += static_cast<int64_t>(size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return ptr;
}

void DeviceAllocator::record_use(void* ptr, Stream stream) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  SW_CHECK(it != live_.end(), "record_use: {} holds no block at {}", memory_.device().to_string(), ptr);
  Block& b = it->second;
  if (stream != b.stream && std::find(b.users.begin(), b.users.end(), stream) == b.users.end()) {
    b.users.push_back(stream);
  }
}

void DeviceAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  SW_CHECK(it != live_.end(), "free: {} holds no block at {}", memory_.device().to_string(), ptr);
  Block block = std::move(it->second);
  live_.erase(it);
  stats_.in_use_bytes -= static_cast<int64_t>(block.size);
  stats_.cached_bytes += static_cast<int64_t>(block.size);
  if (block.users.empty()) {
    cached_[{block.stream.handle, block.size}].push_back(ptr);
    return;
  }
  Pending p{ptr, std::move(block), {}};
  for (Stream s : p.block.users) p.events.push_back(memory_.record_event(s));
  pending_.push_back(std::move(p));
}

void DeviceAllocator::collect_pending() {
  auto passed = [&](Pending& p) {
    for (uint64_t e : p.events) {
      if (!memory_.event_done(e)) return false;
    }
    for (uint64_t e : p.events) memory_.release_event(e);
    cached_[{p.block.stream.handle, p.block.size}].push_back(p.ptr);
    return true;
  };
  std::erase_if(pending_, passed);
}

void DeviceAllocator::release_cached_locked() {
  for (Pending& p : pending_) {
    for (Stream s : p.block.users) memory_.synchronize(s);
  }
  collect_pending();
  for (auto& [key, ptrs] : cached_) {
    for (void* ptr : ptrs) {
      memory_.free(ptr);
      ++stats_.device_frees;
      stats_.cached_bytes -= static_cast<int64_t>(key.second);
      stats_.reserved_bytes -= static_cast<int64_t>(key.second);
    }
  }
  cached_.clear();
}

void DeviceAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

DeviceAllocatorStats DeviceAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void DeviceAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

}  // namespace shardwise
