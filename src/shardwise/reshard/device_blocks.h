#pragma once
// The reshard executor's block moves on device tensors: boxes cut out of a block, pasted into one,
// packed back to back for a collective and unpacked from its result, all with the device's 2-D
// copies (DeviceMemory::copy_2d: trailing whole dims fold into one contiguous row, the next dim
// gives the rows, outer dims loop) queued on this thread's current stream (tensor/current_stream.h).
// No byte of device memory passes through the host. The host blocks' moves stay in executor.cc.
#include <span>

#include "shardwise/reshard/blocks.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::reshard::device_blocks {

// Uninitialized / zero-filled device tensors on `device`, on the current stream.
Tensor empty(DType dtype, const Shape& shape, Device device);
Tensor zeros(DType dtype, const Shape& shape, Device device);
// The part `inner` (global coordinates) of device tensor `t` holding the box `outer`: `t` itself
// when they are the same box, else a new device tensor.
Tensor cut(const Tensor& t, const Box& outer, const Box& inner);
// Writes `piece` (a contiguous device block of inner.shape, or the elements from `first` of a packed
// one) into `t`, which holds `outer`, at `inner`.
void put(Tensor& t, const Box& outer, const Tensor& piece, const Box& inner, int64_t first = 0);
// The boxes `inner` of `t` (holding `outer`) back to back in one new 1-D device tensor.
Tensor pack(const Tensor& t, const Box& outer, std::span<const Box> inner);

}  // namespace shardwise::reshard::device_blocks
