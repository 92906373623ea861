#include "shardwise/train/device_checks.h"

#include "shardwise/core/error.h"
#include "shardwise/train/train_config.h"

namespace shardwise::train {

void check_device_run(const TrainConfig& c, const mesh::Strategy& s) {
  if (c.device.is_host()) return;
  const std::string dev = c.device.to_string();
  SW_CHECK(s.cp < 0, "--device {} with a cp dim in --mesh {}: context-parallel attention on device memory is not built "
           "yet; use a mesh without cp, or --device cpu", dev, s.mesh.to_string());
}

}  // namespace shardwise::train
