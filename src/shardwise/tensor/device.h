#pragma once
// Where a tensor's storage lives: the host (the default) or a CUDA device {kind, index}. Device
// memory is reached only through explicit copies (device_copy.h) and device kernels; host code
// that asks a device tensor for its data gets an error (Tensor::data / raw, docs/architecture.md).
#include <cstdint>
#include <string>

namespace shardwise {

enum class DeviceKind : uint8_t { Host, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Host;
  int index = 0;  // the CUDA ordinal (0 for the host)

  static Device host() { return {}; }
  static Device cuda(int index) { return {DeviceKind::Cuda, index}; }
  bool is_host() const { return kind == DeviceKind::Host; }
  bool operator==(const Device&) const = default;
  std::string to_string() const;  // "host", "cuda:0"
};

// A stream of one device: work queued on it runs in order. The handle is the backend's
// (a cudaStream_t; a number on the fake device); nullptr is the device's default stream.
struct Stream {
  void* handle = nullptr;
  bool operator==(const Stream&) const = default;
};

}  // namespace shardwise
