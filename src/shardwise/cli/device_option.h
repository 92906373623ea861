#pragma once
// The --device option of the commands that run kernels (verify, generate; train can use the same):
// "cpu" (the host), "fake" (the test device: a fake device, tensor/fake_device.h, registered as
// cuda:0, whose kernel table runs every op's CPU kernel on its guarded memory, so device plumbing
// is proved without a GPU) or "cuda" (GPU 0: its memory and the CUDA kernel bindings,
// cuda_ops/bind.h). One place that parses the name, registers the device and installs its kernels.
#include <string>
#include <string_view>

#include "shardwise/tensor/device.h"

namespace shardwise::cli {

// The names --device takes, for help texts and CLI11's IsMember.
inline constexpr std::string_view kDeviceNames = "cpu, fake (the test device) or cuda";

// The device `name` ("cpu", "fake", "cuda", "cuda:N") made ready: registered with its kernel table installed
// (once per process). An Error naming `option` before any work for another name, and for "cuda"
// when this shardwise was built without CUDA or no GPU is visible (saying which).
Device use_device(std::string_view name, std::string_view option = "--device");

// "cpu", "fake (cuda:0)" or "cuda:0": how a run names its device.
std::string device_label(std::string_view name, Device device);

}  // namespace shardwise::cli
