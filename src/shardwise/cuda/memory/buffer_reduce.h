#pragma once
// The launcher of the collectives' reduction on a device (DeviceMemory::reduce on CUDA,
// cuda_memory.cc): device pointers, a count and a stream, C++17 for nvcc. One thread per element
// reduces every input in order in the host's compute type (tensor/buffer_reduce.h), so the bits
// equal the host reduction's.
#include <cstdint>

namespace shardwise::cuda::launch {

// The element types and reductions it knows (tensor/buffer_reduce.h's, named alike).
enum class ReduceElem : uint8_t { F32, F64, F16, BF16, I64, I32, I8, U8, Bool };
enum class ReduceOp : uint8_t { Sum, Avg, Max, Min, Prod };
// At most this many inputs a launch (the pointers travel in the kernel's arguments).
inline constexpr int kMaxReduceInputs = 64;

// out[i] = reduce over r < n of inputs[r][i], r in order; `out` may be inputs[0]. Returns the
// launch's cudaError_t (as int).
int reduce_buffers(const void* const* inputs, int n, void* out, int64_t count, ReduceElem elem, ReduceOp op,
                   void* stream);

}  // namespace shardwise::cuda::launch
