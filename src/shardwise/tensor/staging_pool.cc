#include "shardwise/tensor/staging_pool.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise {

namespace {

constexpr size_t kAlign = 4096;  // page-aligned host blocks (O_DIRECT writes take them as they are)

struct Block {
  std::byte* data;
  bool pinned;
};

struct Pool {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::multimap<size_t, Block>> free;  // device -> capacity -> block
  StagingPoolStats stats;
  size_t limit = size_t{256} << 20;
};

Pool& pool() {
  static auto* p = new Pool();  // never destroyed: buffers may outlive main
  return *p;
}

std::pair<int, int> key_of(Device d) { return {static_cast<int>(d.kind), d.index}; }

void free_block(Device device, const Block& b) {
  if (b.pinned) {
    device_memory(device).free_pinned(b.data);
  } else {
    std::free(b.data);
  }
}

// Frees free blocks, the biggest first, until at most `keep` bytes stay free; the freed blocks are
// returned so the caller frees them without the pool's lock (a backend call may take its own).
std::vector<std::pair<Device, Block>> trim_locked(Pool& p, size_t keep) {
  std::vector<std::pair<Device, Block>> out;
  for (auto& [key, blocks] : p.free) {
    while (p.stats.bytes_free > keep && !blocks.empty()) {
      auto it = std::prev(blocks.end());
      p.stats.bytes_free -= it->first;
      if (it->second.pinned) p.stats.pinned_bytes -= it->first;
      out.push_back({Device{static_cast<DeviceKind>(key.first), key.second}, it->second});
      blocks.erase(it);
    }
  }
  return out;
}

void free_all(const std::vector<std::pair<Device, Block>>& blocks) {
  for (const auto& [device, b] : blocks) free_block(device, b);
}

}  // namespace

StagingBuffer staging_buffer(Device device, size_t bytes) {
  Pool& p = pool();
  const size_t capacity = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  StagingBuffer out;
  out.device_ = device;
  out.size_ = bytes;
  {
    std::lock_guard lock(p.mutex);
    auto& blocks = p.free[key_of(device)];
    auto it = blocks.lower_bound(capacity);
    if (it != blocks.end()) {
      out.data_ = it->second.data;
      out.pinned_ = it->second.pinned;
      out.capacity_ = it->first;
      p.stats.bytes_free -= it->first;
      p.stats.bytes_in_use += it->first;
      p.stats.reuses += 1;
      blocks.erase(it);
      return out;
    }
  }
  void* pinned = device.is_host() ? nullptr : device_memory(device).allocate_pinned(capacity);
  void* data = pinned ? pinned : std::aligned_alloc(kAlign, capacity);
  SW_CHECK(data != nullptr, "staging buffer: {} bytes of host memory for {} could not be allocated", capacity,
           device.to_string());
  out.data_ = static_cast<std::byte*>(data);
  out.pinned_ = pinned != nullptr;
  out.capacity_ = capacity;
  std::lock_guard lock(p.mutex);
  p.stats.allocations += 1;
  p.stats.bytes_in_use += capacity;
  if (out.pinned_) p.stats.pinned_bytes += capacity;
  return out;
}

StagingBuffer::StagingBuffer(StagingBuffer&& other) noexcept { *this = std::move(other); }

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    pinned_ = std::exchange(other.pinned_, false);
    device_ = other.device_;
  }
  return *this;
}

StagingBuffer::~StagingBuffer() { release(); }

void StagingBuffer::resize(size_t bytes) {
  if (data_ != nullptr && bytes <= capacity_) {
    size_ = bytes;
    return;
  }
  const Device device = device_;
  release();
  *this = staging_buffer(device, bytes);
}

void StagingBuffer::release() {
  if (data_ == nullptr) return;
  Pool& p = pool();
  std::vector<std::pair<Device, Block>> freed;
  {
    std::lock_guard lock(p.mutex);
    p.stats.bytes_in_use -= capacity_;
    p.stats.bytes_free += capacity_;
    p.free[key_of(device_)].insert({capacity_, Block{data_, pinned_}});
    freed = trim_locked(p, p.limit);
  }
  free_all(freed);
  data_ = nullptr;
  size_ = capacity_ = 0;
}

StagingPoolStats staging_pool_stats() {
  std::lock_guard lock(pool().mutex);
  return pool().stats;
}

size_t staging_pool_limit() {
  std::lock_guard lock(pool().mutex);
  return pool().limit;
}

void set_staging_pool_limit(size_t bytes) {
  Pool& p = pool();
  std::vector<std::pair<Device, Block>> freed;
  {
    std::lock_guard lock(p.mutex);
    p.limit = bytes;
    freed = trim_locked(p, bytes);
  }
  free_all(freed);
}

void empty_staging_pool(Device device) {
  Pool& p = pool();
  std::vector<std::pair<Device, Block>> freed;
  {
    std::lock_guard lock(p.mutex);
    auto& blocks = p.free[key_of(device)];
    for (auto& [capacity, b] : blocks) {
      p.stats.bytes_free -= capacity;
      if (b.pinned) p.stats.pinned_bytes -= capacity;
      freed.push_back({device, b});
    }
    blocks.clear();
  }
  free_all(freed);
}

}  // namespace shardwise
