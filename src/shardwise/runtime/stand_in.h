#pragma once
// The stand-in a kernel gets for a released buffer whose value it does not read (Runtime's
// release_shape_only_reads: the kernel reads its shape only).
#include "shardwise/tensor/tensor.h"

namespace shardwise::runtime {

// A tensor of `shape` whose value no one reads. From 1 MiB up its storage is a read-only mapping of
// the zero page outside the tensor allocator: it commits no memory and takes nothing from the
// allocator's cache (an uninitialized tensor would: the cache's freed ranges are resident, and the
// memory plan counts the released buffer as gone); it reads as zeros and faults on a write.
// Smaller ones are plain uninitialized tensors.
Tensor shape_only_tensor(DType dtype, const Shape& shape);

}  // namespace shardwise::runtime
