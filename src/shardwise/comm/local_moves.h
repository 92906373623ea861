#pragma once
// How the threads backend (local.cc) moves a call's bytes: host buffers with memcpy and the host
// reduction, device buffers (comm/device_buffers.h) with the device's copies and reduction kernel
// on the caller's stream. Internal to the comm layer.
#include <array>
#include <cstring>
#include <span>
#include <vector>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/comm/reduce_kernels.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::comm {

// A call's memory: the host (memory null), or the device of this thread's DeviceBuffers scope.
struct Moves {
  DeviceMemory* memory = nullptr;
  Stream stream;
  int device = -1;  // the device's index, -1 on the host

  static Moves current() {
    const DeviceBuffers* d = DeviceBuffers::current();
    if (!d) [[likely]] return {};
    return {&device_memory(d->device), d->stream, d->device.index};
  }
  Device device_of() const { return Device::cuda(device); }
  void copy(void* dst, const void* src, size_t n) const {
    if (memory) [[unlikely]] memory->copy_on_device(dst, src, n, stream);
    else std::memcpy(dst, src, n);
  }
  void reduce(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, Reduce op) const {
    if (memory) [[unlikely]] memory->reduce(inputs, out, count, dtype, buffer_reduce(op), stream);
    else reduce_buffers(inputs, out, count, dtype, op);
  }
  // A copy on this stream after `event` (another stream's, released here; 0: none), and the event
  // after it.
  uint64_t copy_after(uint64_t event, void* dst, const void* src, size_t n) const {
    if (event) memory->wait_event(stream, event), memory->release_event(event);
    if (n) memory->copy_on_device(dst, src, n, stream);
    return memory->record_event(stream);
  }
};

// A call's private buffer (a reduced chunk, a queued message) in the call's memory.
struct Scratch {
  std::vector<std::byte> host;
  Tensor device;
  std::byte* data() { return device.defined() ? static_cast<std::byte*>(device.device_ptr()) : host.data(); }
  void resize(const Moves& m, size_t bytes) {
    if (!m.memory) [[likely]] return host.resize(bytes);
    device = empty_on(DType::U8, Shape{static_cast<int64_t>(bytes)}, m.device_of(), m.stream);
  }
};

// A message sent before its receive was posted: its bytes in the sender's memory and, on a device,
// the event after the copy that wrote them.
struct Message {
  Scratch bytes;
  size_t size = 0;
  int device = -1;
  uint64_t done = 0;
};

// The events a rank records in one collective on device buffers (its slot's): released when the
// call ends (every peer has queued its waits for them by then).
class DeviceSteps {
 public:
  DeviceSteps(const Moves& m, std::array<uint64_t, 3>& events) : m_(m), events_(events) {}
  ~DeviceSteps() {
    if (!m_.memory) return;
    for (uint64_t& e : events_) {
      if (e) m_.memory->release_event(e), e = 0;
    }
  }
  DeviceSteps(const DeviceSteps&) = delete;
  DeviceSteps& operator=(const DeviceSteps&) = delete;
  void record() { events_[0] = m_.memory->record_event(m_.stream); }
  // Records the next event of `events` and returns its index.
  static size_t record_next(const Moves& m, std::array<uint64_t, 3>& events) {
    size_t k = 0;
    while (k < events.size() && events[k]) ++k;
    SW_CHECK(k < events.size(), "internal: a collective of more than {} device steps", events.size());
    events[k] = m.memory->record_event(m.stream);
    return k;
  }

 private:
  const Moves& m_;
  std::array<uint64_t, 3>& events_;
};

}  // namespace shardwise::comm
