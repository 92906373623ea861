#include "shardwise/train/device_checks.h"

#include <algorithm>

#include "shardwise/core/error.h"
#include "shardwise/ops/device_kernels.h"
#include "shardwise/train/train_config.h"

namespace shardwise::train {

namespace {

// Whether the device's kernel table has a ring attention kernel of its own (the fake device's; not
// its fallback, which would run the host ring on host views).
bool has_ring_kernels(Device device) {
  const auto table = ops::device_kernels(device.kind);
  if (!table) return false;
  const std::vector<std::string> forward = table->forward_ops(), backward = table->backward_ops();
  return std::ranges::binary_search(forward, "ring_attention") && std::ranges::binary_search(backward, "ring_attention");
}

}  // namespace

void check_device_run(const TrainConfig& c, const mesh::Strategy& s) {
  if (c.device.is_host()) return;
  const std::string dev = c.device.to_string();
  SW_CHECK(s.cp < 0 || has_ring_kernels(c.device),
           "--device {} with a cp dim in --mesh {}: context-parallel attention needs the device's ring_attention "
           "kernel, which its kernel table ({}) does not have (CUDA: the flash-attention kernels take no block "
           "coordinates yet, docs/gpu.md); use a mesh without cp, or --device cpu (or fake)", dev, s.mesh.to_string(),
           ops::device_kernels(c.device.kind) ? ops::device_kernels(c.device.kind)->name() : "none");
}

}  // namespace shardwise::train
