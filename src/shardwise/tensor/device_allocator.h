#pragma once
// The caching device allocator: one per device, over its DeviceMemory (device_memory.h), so the
// same logic runs on the fake device in `make test` and on CUDA.
//
// Size classes: a request is rounded up to 512 bytes below 1 MiB, and above to a quarter of its
// power of two (four classes per doubling, at most 25% rounding). A freed block is cached under
// (its stream, its class) and serves the next request of that class on that stream at once: the
// stream runs in order, so the next user's work queues after the last user's. A block that another
// stream used too (record_use) is kept pending until an event recorded on each such stream at the
// free has passed; only then is it cached. When the device has no memory left, every cached block
// is given back (pending blocks after their streams are synchronised) and the request tried once
// more before a clear out-of-memory error.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardwise/tensor/device_memory.h"

namespace shardwise {

struct DeviceAllocatorStats {
  int64_t in_use_bytes = 0;       // blocks held by their users (class sizes)
  int64_t peak_in_use_bytes = 0;  // since the start or reset_peak()
  int64_t cached_bytes = 0;       // freed blocks kept for reuse, pending ones included
  int64_t reserved_bytes = 0;     // in use + cached: what the allocator holds from the device
  int64_t allocations = 0;        // requests
  int64_t hits = 0;               // of them, served from the cache
  int64_t device_allocations = 0; // blocks asked of the device
  int64_t device_frees = 0;       // blocks given back to the device
};

class DeviceAllocator {
 public:
  explicit DeviceAllocator(DeviceMemory& memory) : memory_(memory) {}
  ~DeviceAllocator();  // gives every cached block back; blocks still in use are left alone
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  static size_t size_class(size_t bytes);

  void* allocate(size_t bytes, Stream stream);
  void free(void* ptr);
  // `ptr` is also used by work on `stream` (not the one it was allocated on).
  void record_use(void* ptr, Stream stream);
  // Gives every cached block back to the device, waiting for pending ones.
  void release_cached();
  DeviceAllocatorStats stats() const;
  void reset_peak();
  DeviceMemory& memory() { return memory_; }

 private:
  struct Block {
    size_t size = 0;
    Stream stream;
    std::vector<Stream> users;  // other streams that used it
  };
  struct Pending {
    void* ptr = nullptr;
    Block block;
    std::vector<uint64_t> events;
  };
  using Key = std::pair<void*, size_t>;  // (stream handle, size class)

  void collect_pending();  // moves pending blocks whose events have passed to the cache
  void release_cached_locked();
  void* take_cached(size_t size, Stream stream);

  DeviceMemory& memory_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<Key, std::vector<void*>> cached_;
  std::vector<Pending> pending_;
  DeviceAllocatorStats stats_;
};

// The allocator of a device with registered memory (device_memory.h).
DeviceAllocator& device_allocator(Device device);

}  // namespace shardwise
