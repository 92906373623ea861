#include "shardwise/tensor/device_copy.h"

#include <atomic>

#include "shardwise/tensor/device_allocator.h"

namespace shardwise {

namespace {

struct Counters {
  std::atomic<int64_t> to_device_copies{0}, to_device_bytes{0}, to_host_copies{0}, to_host_bytes{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

}  // namespace

Tensor empty_on(DType dtype, const Shape& shape, Device device, Stream stream) {
  SW_CHECK(!device.is_host(), "empty_on: {} is the host; use Tensor::uninitialized", device.to_string());
  DeviceAllocator& allocator = device_allocator(device);
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto* ptr = static_cast<std::byte*>(allocator.allocate(bytes, stream));
  std::shared_ptr<std::byte[]> storage(ptr, [a = &allocator](std::byte* p) { a->free(p); });
  return Tensor::adopt_device(dtype, shape, device, std::move(storage));
}

Tensor zeros_on(DType dtype, const Shape& shape, Device device, Stream stream) {
  Tensor t = empty_on(dtype, shape, device, stream);
  device_memory(device).fill_zero(t.device_ptr(), t.nbytes(), stream);
  return t;
}

Tensor to_device(const Tensor& host, Device device, Stream stream) {
  SW_CHECK(host.defined(), "to_device: the tensor is undefined");
  SW_CHECK(!host.on_device(), "to_device: the {} {} tensor is already on {}", dtype_name(host.dtype()),
           host.shape().to_string(), host.device().to_string());
  Tensor t = empty_on(host.dtype(), host.shape(), device, stream);
  copy_from_host(std::span<const std::byte>(host.raw(), host.nbytes()), t, stream);
  return t;
}

Tensor to_host(const Tensor& t, Stream stream) {
  SW_CHECK(t.defined(), "to_host: the tensor is undefined");
  Tensor host = Tensor::uninitialized(t.dtype(), t.shape());
  copy_to_host(t, std::span<std::byte>(host.raw(), host.nbytes()), stream);
  return host;
}

// The backend of device tensor `t`, once `t` and a host buffer of `host_bytes` suit a copy `what`.
static DeviceMemory& memory_for(const Tensor& t, size_t host_bytes, const char* what) {
  SW_CHECK(t.defined(), "{}: the tensor is undefined", what);
  SW_CHECK(t.on_device(), "{}: the {} {} tensor is on the host", what, dtype_name(t.dtype()), t.shape().to_string());
  SW_CHECK(host_bytes == t.nbytes(), "{}: the {} {} tensor on {} has {} bytes, the host buffer {}", what,
           dtype_name(t.dtype()), t.shape().to_string(), t.device().to_string(), t.nbytes(), host_bytes);
  return device_memory(t.device());
}

void copy_to_host(const Tensor& t, std::span<std::byte> dst, Stream stream) {
  DeviceMemory& memory = memory_for(t, dst.size(), "copy to host");
  memory.copy_to_host(dst.data(), t.device_ptr(), t.nbytes(), stream);
  memory.synchronize(stream);
  counters().to_host_copies += 1;
  counters().to_host_bytes += static_cast<int64_t>(t.nbytes());
}

void copy_from_host(std::span<const std::byte> src, Tensor& t, Stream stream) {
  DeviceMemory& memory = memory_for(t, src.size(), "copy to device");
  memory.copy_to_device(t.device_ptr(), src.data(), t.nbytes(), stream);
  memory.synchronize(stream);
  counters().to_device_copies += 1;
  counters().to_device_bytes += static_cast<int64_t>(t.nbytes());
}

DeviceCopyStats device_copy_stats() {
  const Counters& c = counters();
  return {c.to_device_copies.load(), c.to_device_bytes.load(), c.to_host_copies.load(), c.to_host_bytes.load()};
}

void reset_device_copy_stats() {
  Counters& c = counters();
  c.to_device_copies = 0;
  c.to_device_bytes = 0;
  c.to_host_copies = 0;
  c.to_host_bytes = 0;
}

}  // namespace shardwise
