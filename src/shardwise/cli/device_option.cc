#include "shardwise/cli/device_option.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
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

// The GPU of "cuda" (0) or "cuda:N".
int cuda_index(std::string_view name, std::string_view option) {
  if (name == "cuda") return 0;
  int index = -1;
  const char* begin = name.data() + 5;
  const char* end = name.data() + name.size();
  const auto [at, ec] = std::from_chars(begin, end, index);
  SW_CHECK(ec == std::errc() && at == end && index >= 0, "{} {}: a GPU is cuda or cuda:N (N from 0)", option, name);
  return index;
}

FakeDeviceMemory* the_fake = nullptr;

// At exit: a run on the fake device whose streams raced (work on one stream on memory another
// stream used, with no event or host wait between: a race on a GPU) fails, naming them.
void fail_on_stream_races() {
  const std::vector<std::string> races = the_fake->stream_races();
  if (races.empty()) return;
  fmt::print(stderr, "shardwise: {} stream race(s) on the fake device, each a race on a GPU:\n{}\n", races.size(),
             fmt::join(races, "\n"));
  std::fflush(stderr);
  std::_Exit(70);
}

Device use_fake() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Every rank's parameters, state and activations share it (address space only until used):
    // room for the tiny and small models of the tests and the docs.
    the_fake = &register_fake_device({.index = 0, .capacity = size_t{16} << 30});
    ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
    std::atexit(fail_on_stream_races);
  });
  return Device::cuda(0);
}

Device use_cuda(std::string_view name, std::string_view option) {
  const int index = cuda_index(name, option);
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
  SW_CHECK(gpus > 0, "{} {}: no GPU is visible to this process ({})", option, name,
           why.empty() ? "CUDA found none" : why);
  SW_CHECK(index < gpus, "{} {}: this process sees {} GPU{} (cuda:0{})", option, name, gpus, gpus == 1 ? "" : "s",
           gpus == 1 ? "" : fmt::format(" to cuda:{}", gpus - 1));
  return Device::cuda(index);
#else
  (void)index;
  fail("{} {}: this shardwise was built without CUDA (configure where nvcc and the CUDA toolkit are found, "
       "-DSHARDWISE_WITH_CUDA=ON to insist); use {} cpu", option, name, option);
#endif
}

}  // namespace

Device use_device(std::string_view name, std::string_view option) {
  if (name == "cpu") return Device::host();
  if (name == "fake") return use_fake();
  if (name == "cuda" || name.starts_with("cuda:")) return use_cuda(name, option);
  fail("{} {}: unknown device; use {}", option, name, kDeviceNames);
}

std::string device_label(std::string_view name, Device device) {
  if (name == "fake") return fmt::format("fake ({})", device.to_string());
  return device.is_host() ? "cpu" : device.to_string();
}

}  // namespace shardwise::cli
