#pragma once
// The few calls the device allocator and the copies need from a device, so their logic runs on a
// fake device (fake_device.h: host memory pretending to be device memory) in `make test`, and on
// CUDA (src/shardwise/cuda/memory/cuda_memory.cc) where the toolkit is found. One backend per device,
// registered once per process (register_device_memory); nothing is registered by default.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "shardwise/core/dtype.h"
#include "shardwise/tensor/buffer_reduce.h"
#include "shardwise/tensor/device.h"

namespace shardwise {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  // `bytes` of device memory, or nullptr when the device has none left (the allocator then
  // empties its cache and asks once more). free() takes only what allocate() gave.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  // Page-locked host memory for staging copies (staging_pool.h), or nullptr where the backend has
  // none (the staging pool then uses plain host memory). free_pinned takes only what allocate_pinned gave.
  virtual void* allocate_pinned(size_t /*bytes*/) { return nullptr; }
  virtual void free_pinned(void* /*ptr*/) {}
  // Copies queued on `stream`; they have finished once synchronize(stream) returns.
  virtual void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual void fill_zero(void* dst, size_t bytes, Stream stream) = 0;
  // `rows` rows of `row_bytes` bytes from device memory `src` (rows `src_pitch` bytes apart) to
  // device memory `dst` (rows `dst_pitch` apart), queued on `stream` (cudaMemcpy2DAsync); the
  // pitches are at least `row_bytes` when there is more than one row. The boxes a reshard packs
  // and unpacks are made of such copies.
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
                       Stream stream) = 0;
  // out[i] = the reduction of inputs[0][i], inputs[1][i], ... in that order (device memory, `count`
  // elements of `dtype` each), queued on `stream`: buffer_reduce.h's arithmetic, the same bits as
  // the host's reduce_buffers. `out` may be inputs[0], no other input. The collectives on device
  // memory reduce with it.
  virtual void reduce(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, BufferReduce op,
                      Stream stream) = 0;
  virtual void synchronize(Stream stream) = 0;
  // Events mark a point in a stream: done() is true once the work queued before it has run.
  // An event is released with release_event once nobody waits on it.
  virtual uint64_t record_event(Stream stream) = 0;
  virtual bool event_done(uint64_t event) = 0;
  virtual void release_event(uint64_t event) = 0;
  // Work queued on `stream` after this call waits for `event` (the host does not wait).
  virtual void wait_event(Stream stream, uint64_t event) = 0;
  // A stream of its own (work on it runs in order, concurrently with other streams' work).
  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream stream) = 0;
};

// Installs the backend of its device (replacing any earlier one; the device's allocator is
// rebuilt and its staging pool emptied, so no tensor or staging buffer of the old backend may
// still be alive).
void register_device_memory(std::unique_ptr<DeviceMemory> memory);
// The backend of `device`; a clear error when none is registered (a build without CUDA, or no GPU).
DeviceMemory& device_memory(Device device);
bool has_device_memory(Device device);

}  // namespace shardwise
