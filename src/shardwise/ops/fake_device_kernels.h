#pragma once
// The fake device's kernel table (tensor/fake_device.h): every op runs its CPU kernel on the fake
// device's memory, opened for the kernel's duration only (an access window, not a counted copy;
// ring_attention(_docs): ring.h's ring on device tensors, its pieces so and its transfers device-buffer calls), so
// a whole program can run with every tensor on the fake device and the copies between host and
// device (device_copy_stats) are exactly the ones the program asks for. How device plumbing is
// proved on a machine without a GPU.
#include <memory>

#include "shardwise/ops/device_kernels.h"

namespace shardwise::ops {

// The table (name "fake"); install it for DeviceKind::Cuda while a fake device is registered as the
// CUDA device (install_device_kernels). Its kernels are an Error on a device whose memory is not a
// FakeDeviceMemory.
std::shared_ptr<const DeviceKernelTable> fake_device_kernels();

}  // namespace shardwise::ops
