#pragma once
// Byte ranges of device tensors moved on the device (no host view): what the gradient buckets pack
// and unpack and the sharded optimizer cuts its ranges with on a device run.
#include <cstddef>
#include <optional>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

// Copies `bytes` from `src` at byte `src_at` into `dst` at byte `dst_at`: a memcpy for host
// tensors, for device tensors (both on one device) a device copy queued on the thread's current
// stream (nothing when `bytes` is 0).
void copy_bytes(const Tensor& dst, size_t dst_at, const Tensor& src, size_t src_at, size_t bytes);

// An uninitialized tensor where `like` lives: on the host, or on its device (current stream).
Tensor uninitialized_like(const Tensor& like, DType dtype, const Shape& shape);
// What a communicator call takes for `t`: its device pointer, or its host data.
void* buffer_of(Tensor& t);

// While alive, this thread's communicator calls take device buffers of `t`'s device on the current
// stream (comm::DeviceBuffers) when `t` is a device tensor; nothing for a host tensor.
class BuffersOf {
 public:
  explicit BuffersOf(const Tensor& t);

 private:
  std::optional<comm::DeviceBuffers> scope_;
};

}  // namespace shardwise::train
