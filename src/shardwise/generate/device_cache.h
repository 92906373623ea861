#pragma once
// The KV cache on a device: a step's keys or values written into the cache with device-to-device
// copies (DeviceMemory::copy_on_device; no host access, no counted host-device copy).
#include <cstdint>

#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

// Row `row` of `block` [R, H, T, D] into row `row` of `cache` [R', H, C, D] at slots
// [position, position + T), queued on `stream`: one copy of T x D elements per head. Both on one
// device, of one dtype; an Error naming the shapes otherwise.
void paste_rows_on_device(Tensor& cache, const Tensor& block, int64_t row, int64_t position, Stream stream);

}  // namespace shardwise::train
