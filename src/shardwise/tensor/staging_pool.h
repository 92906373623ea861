#pragma once
// Host staging buffers for copies between host and device memory (checkpoints save through them and
// load through them): page-locked where the device's backend gives such memory
// (DeviceMemory::allocate_pinned: cudaHostAlloc on CUDA), so its copy engine reads and writes them
// while the host runs on; plain host memory otherwise (the fake device, the host, a backend that
// has none). A released buffer goes back to a small pool of its device and is reused by the next
// request it fits (best fit); the pool keeps at most staging_pool_limit() bytes free and frees the rest.
#include <cstddef>
#include <cstdint>
#include <span>

#include "shardwise/tensor/device.h"

namespace shardwise {

class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(StagingBuffer&& other) noexcept;
  StagingBuffer& operator=(StagingBuffer&& other) noexcept;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer();  // back to its device's pool

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }          // the bytes asked for
  size_t capacity() const { return capacity_; }  // the block's bytes (at least size())
  bool pinned() const { return pinned_; }
  Device device() const { return device_; }
  std::span<std::byte> bytes() const { return {data_, size_}; }
  // Asks for `bytes` (same device): keeps the block when it is big enough, else trades it for one.
  void resize(size_t bytes);

 private:
  friend StagingBuffer staging_buffer(Device device, size_t bytes);
  void release();
  std::byte* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
  bool pinned_ = false;
  Device device_;
};

// A buffer of `bytes` for copies to and from `device` (Device::host(): plain host memory).
StagingBuffer staging_buffer(Device device, size_t bytes);

struct StagingPoolStats {
  int64_t allocations = 0;  // blocks taken from the backend or the host
  int64_t reuses = 0;       // requests met by a block of the pool
  size_t bytes_in_use = 0;  // blocks held by live buffers
  size_t bytes_free = 0;    // blocks kept in the pools for reuse
  size_t pinned_bytes = 0;  // of both, page-locked
};
StagingPoolStats staging_pool_stats();
size_t staging_pool_limit();
void set_staging_pool_limit(size_t bytes);  // default 256 MiB; frees blocks beyond it at once
// Frees the free blocks of `device`'s pool (register_device_memory does, before it replaces a backend).
void empty_staging_pool(Device device);

}  // namespace shardwise
