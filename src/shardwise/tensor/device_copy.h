#pragma once
// The only ways between host and device memory: explicit copies, each counted (device_copy_stats),
// so a run's host/device traffic is visible. A device tensor's storage comes from its device's
// caching allocator (device_allocator.h) on the stream given, and goes back to it when the last
// copy of the handle goes.
#include <cstddef>
#include <cstdint>
#include <span>

#include "shardwise/tensor/tensor.h"

namespace shardwise {

// Device tensors with storage from the allocator: uninitialized, or zero-filled on `stream`.
Tensor empty_on(DType dtype, const Shape& shape, Device device, Stream stream = {});
Tensor zeros_on(DType dtype, const Shape& shape, Device device, Stream stream = {});

// A copy of host tensor `host` on `device`; returns once the copy has run (the host data may change).
Tensor to_device(const Tensor& host, Device device, Stream stream = {});
// A host copy of device tensor `t`, after the work queued on `stream` before it has run.
Tensor to_host(const Tensor& t, Stream stream = {});

// The same copies between device tensor `t` and host bytes the caller holds (a staging buffer,
// staging_pool.h), exactly t.nbytes() of them; each returns once the copy has run, and is counted
// as one to_host / to_device copy.
void copy_to_host(const Tensor& t, std::span<std::byte> dst, Stream stream = {});
void copy_from_host(std::span<const std::byte> src, Tensor& t, Stream stream = {});

struct DeviceCopyStats {
  int64_t to_device_copies = 0;
  int64_t to_device_bytes = 0;
  int64_t to_host_copies = 0;
  int64_t to_host_bytes = 0;
};
DeviceCopyStats device_copy_stats();
void reset_device_copy_stats();

}  // namespace shardwise
