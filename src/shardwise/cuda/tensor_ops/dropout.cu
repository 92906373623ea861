// Dropout on the GPU drawing core/philox.h's stream: counter (block index, stream id), key the seed,
// ten rounds of Philox-4x32; element g takes lane g % 4 of block g / 4, its uniform the top 24 bits.
// The same (seed, stream, global index) gives the CPU's mask bit for bit, whatever the sharding.
#include <cstdint>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/walk.cuh"

namespace shardwise::cuda::launch {

namespace {

using namespace detail;

__device__ uint32_t philox_lane(unsigned long long g, unsigned long long seed, unsigned long long stream) {
  const unsigned long long block = g >> 2;
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  const unsigned lane = static_cast<unsigned>(g & 3);  // no array: it would live in local memory
  return lane == 0 ? c0 : lane == 1 ? c1 : lane == 2 ? c2 : c3;
}

template <class T>
__global__ void dropout_kernel(const T* x, T* out, uint8_t* mask, long long n, Walk global, unsigned long long seed,
                               unsigned long long stream, double p, float scale) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const auto g = static_cast<unsigned long long>(walk_offsets<1>(global, i).at[0]);
    const float u = static_cast<float>(philox_lane(g, seed, stream) >> 8) * (1.0f / 16777216.0f);
    const bool keep = static_cast<double>(u) >= p;
    mask[i] = keep ? 1 : 0;
    out[i] = from_f<T>(to_f(x[i]) * (keep ? scale : 0.0f));
  }
}

template <class T>
__global__ void apply_kernel(const T* x, const uint8_t* mask, T* out, long long n, float scale) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    out[i] = from_f<T>(to_f(x[i]) * (mask[i] ? scale : 0.0f));
  }
}

}  // namespace

int dropout_forward(Elem t, const void* x, void* out, uint8_t* mask, const Walk& global, uint64_t seed,
                    uint64_t stream, double p, float scale, void* s) {
  const long long n = global.numel();
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    dropout_kernel<T><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
        static_cast<const T*>(x), static_cast<T*>(out), mask, n, global, seed, stream, p, scale);
    return static_cast<int>(cudaGetLastError());
  });
}

int dropout_apply(Elem t, const void* x, const uint8_t* mask, void* out, int64_t n, float scale, void* s) {
  if (n == 0) return cudaSuccess;
  return with_elem(t, [&](auto v) {
    using T = decltype(v);
    apply_kernel<T><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const T*>(x), mask,
                                                                               static_cast<T*>(out), n, scale);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace shardwise::cuda::launch
