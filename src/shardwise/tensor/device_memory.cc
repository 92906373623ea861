#include "shardwise/tensor/device_memory.h"

#include <map>
#include <mutex>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/staging_pool.h"

namespace shardwise {

std::string Device::to_string() const {
  return kind == DeviceKind::Host ? std::string("host") : "cuda:" + std::to_string(index);
}

namespace {

struct Registered {
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<DeviceAllocator> allocator;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<int, Registered>& registry() {
  static auto* r = new std::map<int, Registered>();  // never destroyed: tensors may outlive main
  return *r;
}

Registered& find(Device device) {
  SW_CHECK(!device.is_host(), "the host has no device memory backend");
  auto it = registry().find(device.index);
  SW_CHECK(it != registry().end(),
           "no device memory for {}: this build has no CUDA, or no GPU was found and no fake device was "
           "registered", device.to_string());
  return it->second;
}

}  // namespace

void register_device_memory(std::unique_ptr<DeviceMemory> memory) {
  SW_CHECK(memory != nullptr, "register_device_memory: no backend");
  const Device device = memory->device();
  SW_CHECK(device.kind == DeviceKind::Cuda, "register_device_memory: {} is not a device", device.to_string());
  empty_staging_pool(device);  // its pinned blocks go back to the backend that gave them
  std::lock_guard lock(registry_mutex());
  Registered& r = registry()[device.index];
  r.allocator.reset();
  r.memory = std::move(memory);
  r.allocator = std::make_unique<DeviceAllocator>(*r.memory);
}

DeviceMemory& device_memory(Device device) {
  std::lock_guard lock(registry_mutex());
  return *find(device).memory;
}

DeviceAllocator& device_allocator(Device device) {
  std::lock_guard lock(registry_mutex());
  return *find(device).allocator;
}

bool has_device_memory(Device device) {
  std::lock_guard lock(registry_mutex());
  return !device.is_host() && registry().count(device.index) != 0;
}

}  // namespace shardwise
