#pragma once
// Elementwise reduction of several equally sized buffers, in buffer order (deterministic): the one
// arithmetic every collective's reduction follows, on the host (here) and on a device
// (DeviceMemory::reduce, whose backends give the same bits). Sums accumulate in the dtype's compute
// type (float for f16 / bf16) and round once; Avg divides that sum by the number of buffers before
// rounding. Max and min propagate NaN and order signed zeros, so that two operands give the same
// bits in either order (MPI and NCCL combine partial results in orders that differ between ranks).
#include <cstdint>
#include <span>

#include "shardwise/core/dtype.h"

namespace shardwise {

// The reductions of a collective (comm::Reduce, named alike).
enum class BufferReduce : uint8_t { Sum, Avg, Max, Min, Prod };

// out[i] = reduce over r of inputs[r][i], r in order. `out` may be inputs[0], no other input.
void reduce_buffers(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, BufferReduce op);

}  // namespace shardwise
