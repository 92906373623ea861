#pragma once
// Elementwise reduction of several equally sized buffers, in buffer order (deterministic).
#include <span>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

void reduce_buffers(std::span<const void* const> inputs, void* out, int64_t count, DType dtype, Reduce op);

}  // namespace shardwise::comm
