#pragma once
// The collectives' host reduction: tensor/buffer_reduce.h's (shared with the device backends'
// DeviceMemory::reduce), on comm::Reduce.
#include <span>

#include "shardwise/comm/communicator.h"
#include "shardwise/tensor/buffer_reduce.h"

namespace shardwise::comm {

static_assert(static_cast<int>(Reduce::Sum) == static_cast<int>(BufferReduce::Sum) &&
              static_cast<int>(Reduce::Avg) == static_cast<int>(BufferReduce::Avg) &&
              static_cast<int>(Reduce::Max) == static_cast<int>(BufferReduce::Max) &&
              static_cast<int>(Reduce::Min) == static_cast<int>(BufferReduce::Min) &&
              static_cast<int>(Reduce::Prod) == static_cast<int>(BufferReduce::Prod));
inline BufferReduce buffer_reduce(Reduce op) { return static_cast<BufferReduce>(op); }

inline void reduce_buffers(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, Reduce op) {
  shardwise::reduce_buffers(inputs, out, count, dtype, buffer_reduce(op));
}

}  // namespace shardwise::comm
