#pragma once
// Checkpoints of tensors in device memory (docs/gpu.md). Saving, every device block a rank writes is
// copied once into a host staging buffer (tensor/staging_pool.h: page-locked on CUDA, counted by
// device_copy_stats) and written from there; an AsyncSaver makes those copies before save() returns
// and writes from them in the background. Loading, each block is read on the host and copied into
// device memory through a staging buffer (LoadOptions::device). The files are those of the same
// tensors saved from the host, byte for byte, so a checkpoint crosses between device and host.
#include <map>
#include <string>

#include "shardwise/tensor/staging_pool.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ckpt {

// Staging buffers by "<group>/<tensor name>", kept by their owner and reused by its next save.
using StagingBuffers = std::map<std::string, StagingBuffer>;

// A tensor on `device` holding host tensor `host`, through a staging buffer (one counted copy).
Tensor to_device_staged(const Tensor& host, Device device);
// Copies host tensor `host` into device tensor `dst` (same dtype and shape) through a staging
// buffer: loading into device tensors a trainer already holds.
void copy_into_device(const Tensor& host, Tensor& dst);

}  // namespace shardwise::ckpt
