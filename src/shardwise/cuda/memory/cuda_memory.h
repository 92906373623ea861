#pragma once
// The CUDA backend of the tensor layer's device memory (tensor/device_memory.h): cudaMalloc'd
// blocks (the caching allocator above them keeps them), copies with cudaMemcpyAsync on the stream
// given, events without timing. Built only where the CUDA toolkit is found (SHARDWISE_CUDA).
#include <string>

#include "shardwise/tensor/device.h"

namespace shardwise::cuda {

// GPUs this process sees; 0 when there is none or no driver (`why` then says what CUDA said).
int device_count(std::string* why = nullptr);
// Registers the device memory of every GPU (device_memory.h); returns how many.
int register_devices();
// A new non-blocking stream on `device` / its destruction.
Stream create_stream(Device device);
void destroy_stream(Device device, Stream stream);
void synchronize(Device device, Stream stream = {});

// Throws an Error naming `what` when `status` (a cudaError_t) is not cudaSuccess.
void check(int status, const char* what);
// After a kernel launch: the launch error, if any.
void check_launch(const char* kernel);

}  // namespace shardwise::cuda
