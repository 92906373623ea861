#include "shardwise/train/device_ranges.h"

#include <cstring>

#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::train {

void copy_bytes(const Tensor& dst, size_t dst_at, const Tensor& src, size_t src_at, size_t bytes) {
  if (bytes == 0) return;
  SW_CHECK(dst.device() == src.device(), "copy: from {} to {}; both must be on one device", src.device().to_string(),
           dst.device().to_string());
  SW_CHECK(dst_at + bytes <= dst.nbytes() && src_at + bytes <= src.nbytes(),
           "copy: {} bytes from byte {} of {} into byte {} of {}", bytes, src_at, src.nbytes(), dst_at, dst.nbytes());
  if (!dst.on_device()) {
    std::memcpy(const_cast<Tensor&>(dst).raw() + dst_at, src.raw() + src_at, bytes);
    return;
  }
  device_memory(dst.device()).copy_on_device(static_cast<std::byte*>(const_cast<void*>(dst.device_ptr())) + dst_at,
                                             static_cast<const std::byte*>(src.device_ptr()) + src_at, bytes,
                                             current_stream());
}

Tensor uninitialized_like(const Tensor& like, DType dtype, const Shape& shape) {
  return like.on_device() ? empty_on(dtype, shape, like.device(), current_stream()) : Tensor::uninitialized(dtype, shape);
}

void* buffer_of(Tensor& t) { return t.on_device() ? t.device_ptr() : t.raw(); }

BuffersOf::BuffersOf(const Tensor& t) {
  if (t.on_device()) scope_.emplace(t.device(), current_stream());
}

}  // namespace shardwise::train
