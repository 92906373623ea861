#include "shardwise/cli/device_option.h"

#include <fmt/format.h>

#include <mutex>

#include "shardwise/core/error.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/fake_device.h"
#ifdef SHARDWISE_CLI_CUDA
#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda_ops/bind.h"
#endif

namespace shardwise::cli {

namespace {

Device use_fake() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_fake_device({.index = 0});
    ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  });
  return Device::cuda(0);
}

Device use_cuda(std::string_view option) {
#ifdef SHARDWISE_CLI_CUDA
  static std::once_flag once;
  static std::string why;
  static int gpus = 0;
  std::call_once(once, [] {
    gpus = cuda::device_count(&why);
    if (gpus > 0) {
      cuda::register_devices();
      cuda_ops::install_cuda_kernels();
    }
  });
  SW_CHECK(gpus > 0, "{} cuda: no GPU is visible to this process ({})", option, why.empty() ? "CUDA found none" : why);
  return Device::cuda(0);
#else
  fail("{} cuda: this shardwise was built without CUDA (configure where nvcc and the CUDA toolkit are found, "
       "-DSHARDWISE_WITH_CUDA=ON to insist); use {} cpu", option, option);
#endif
}

}  // namespace

Device use_device(std::string_view name, std::string_view option) {
  if (name == "cpu") return Device::host();
  if (name == "fake") return use_fake();
  if (name == "cuda") return use_cuda(option);
  fail("{} {}: unknown device; use {}", option, name, kDeviceNames);
}

std::string device_label(std::string_view name, Device device) {
  if (name == "fake") return fmt::format("fake ({})", device.to_string());
  return device.is_host() ? "cpu" : device.to_string();
}

}  // namespace shardwise::cli
