#pragma once
// What a run on a device (TrainConfig::device other than the host) supports, checked before any
// work: one rank, or dp / tp (and sp) / pp ranks as threads whose gradients are reduced in the graph or
// by gradient buckets (--overlap-grad-reduce on|after: collectives on device memory), sharding
// stages 1-3, LoRA, GPT-2, Llama and Mixtral (with ep ranks too: the MoE kernel's all-gather and
// all_to_all_v on device buffers), models built in Python, --bf16, validation and evaluation; cp
// ranks where the device's kernel table has ring_attention kernels of its own (the fake device's;
// not CUDA's yet, which is refused naming the kernel). What is not built on a device yet is an
// Error naming the option and what it needs (docs/gpu.md).
#include "shardwise/mesh/strategy.h"

namespace shardwise::train {

struct TrainConfig;

// Error for a configuration a device run does not support (nothing on the host).
void check_device_run(const TrainConfig& c, const mesh::Strategy& s);

}  // namespace shardwise::train
