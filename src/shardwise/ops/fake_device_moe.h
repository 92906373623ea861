#pragma once
// moe_mlp in the fake device's kernel table (fake_device_kernels.h): its CPU kernel with the
// exchanges on device buffers (fake_device_moe.cc).
#include <memory>

#include "shardwise/ops/device_kernels.h"
#include "shardwise/ops/moe/moves.h"

namespace shardwise::ops {

class HostWindow;

// The moves the binding gives the kernel, on `window`'s device (tests call the kernel with them).
std::unique_ptr<MoeMoves> fake_moe_moves(const HostWindow& window);
void bind_fake_moe(DeviceKernelTable& table);

}  // namespace shardwise::ops
