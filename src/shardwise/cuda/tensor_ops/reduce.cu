// Sums (and means) over a set of dims, and the strided copies the layout ops are made of
// (transpose, slice, concat, split, expand, contiguous): one thread per output element. A sum runs
// over its reduced elements in row-major order in double and rounds once, as the CPU's float sums
// accumulate in double: the same bits on every run.
#include <cstdint>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/walk.cuh"

namespace shardwise::cuda::launch {

namespace {

using namespace detail;

template <class T>
__global__ void sum_kernel(const T* x, T* out, long long outputs, Walk kept, Walk reduced, long long count,
                           double divisor) {
  for (long long j = first_index(); j < outputs; j += grid_step()) {
    const long long base = walk_offsets<1>(kept, j).at[0];
    double sum = 0;
    for (long long r = 0; r < count; ++r) sum += to_f(x[base + walk_offsets<1>(reduced, r).at[0]]);
    out[j] = from_f<T>(static_cast<float>(sum / divisor));
  }
}

template <class U>
__global__ void copy_kernel(const U* src, U* dst, long long n, Walk w) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const Offsets<2> o = walk_offsets<2>(w, i);
    dst[o.at[1]] = src[o.at[0]];
  }
}

template <class U>
int copy_as(const void* src, void* dst, long long n, const Walk& w, void* s) {
  copy_kernel<U><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const U*>(src),
                                                                            static_cast<U*>(dst), n, w);
  return cudaGetLastError();
}

template <class T>
int sum_as(const void* x, void* out, const Walk& kept, const Walk& reduced, double divisor, void* s) {
  const long long outputs = kept.numel();
  sum_kernel<T><<<grid_for(outputs), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      static_cast<const T*>(x), static_cast<T*>(out), outputs, kept, reduced, reduced.numel(), divisor);
  return cudaGetLastError();
}

}  // namespace

int reduce_sum(Elem t, const void* x, void* out, const Walk& kept, const Walk& reduced, double divisor, void* s) {
  if (kept.numel() == 0) return cudaSuccess;
  switch (t) {
    case Elem::F32: return sum_as<float>(x, out, kept, reduced, divisor, s);
    case Elem::BF16: return sum_as<__nv_bfloat16>(x, out, kept, reduced, divisor, s);
    case Elem::F16: return sum_as<__half>(x, out, kept, reduced, divisor, s);
  }
  return cudaErrorInvalidValue;
}

int strided_copy(int bytes, const void* src, void* dst, const Walk& w, void* s) {
  const long long n = w.numel();
  if (n == 0) return cudaSuccess;
  switch (bytes) {
    case 1: return copy_as<uint8_t>(src, dst, n, w, s);
    case 2: return copy_as<uint16_t>(src, dst, n, w, s);
    case 4: return copy_as<uint32_t>(src, dst, n, w, s);
    case 8: return copy_as<uint64_t>(src, dst, n, w, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace shardwise::cuda::launch
