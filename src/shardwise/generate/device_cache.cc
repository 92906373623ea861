#include "shardwise/generate/device_cache.h"

#include <cstddef>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::train {

void paste_rows_on_device(Tensor& cache, const Tensor& block, int64_t row, int64_t position, Stream stream) {
  const Shape& c = cache.shape();
  const Shape& b = block.shape();
  SW_CHECK(cache.on_device() && block.device() == cache.device() && block.dtype() == cache.dtype() && c.ndim() == 4 &&
               b.ndim() == 4 && b[1] == c[1] && b[3] == c[3] && row >= 0 && row < b[0] && row < c[0] &&
               position >= 0 && position + b[2] <= c[2],
           "KV cache on a device: cannot write row {} of the {} {} block on {} at slot {} of the {} {} cache on {}", row,
           dtype_name(block.dtype()), b.to_string(), block.device().to_string(), position, dtype_name(cache.dtype()),
           c.to_string(), cache.device().to_string());
  const int64_t heads = c[1], slots = c[2], steps = b[2], width = c[3];
  const auto element = static_cast<int64_t>(dtype_size(cache.dtype()));
  DeviceMemory& memory = device_memory(cache.device());
  auto* dst = static_cast<std::byte*>(cache.device_ptr());
  const auto* src = static_cast<const std::byte*>(block.device_ptr());
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t to = ((row * heads + h) * slots + position) * width, from = (row * heads + h) * steps * width;
    memory.copy_on_device(dst + to * element, src + from * element, static_cast<size_t>(steps * width * element), stream);
  }
}

}  // namespace shardwise::train
