#pragma once
// Elementwise reduction of several equally sized buffers, in buffer order (deterministic). Max and
// min propagate NaN and order signed zeros, so that two operands give the same bits in either order
// (MPI and NCCL combine partial results in orders that differ between ranks).
#include <span>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

void reduce_buffers(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, Reduce op);

}  // namespace shardwise::comm
