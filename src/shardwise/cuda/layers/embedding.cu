// Embedding forward and its gradient (ops/index/kernels.cc's embedding): the forward copies each
// id's row of this rank's vocab block (zeros for an id outside the block); the gradient sorts the
// (id, position) pairs with CUB's stable radix sort, then each id's run adds its positions' dout
// rows in position order, one thread per column: the CPU's sums in the CPU's order, with no
// atomics, so the same bits as the CPU and on every run. A bf16 gradient sums the same way in float
// and rounds once (the CPU's f32 gradient of the same dout, rounded to bf16). A first pass flags the first id outside
// [0, vocab_size).
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/element.cuh"
#include "shardwise/cuda/common/launchers.h"

namespace shardwise::cuda::launch {

namespace {

using detail::grid_for;
using detail::kBlock;

__device__ inline long long id_at(const void* ids, bool i32, long long i) {
  return i32 ? static_cast<const int*>(ids)[i] : static_cast<const long long*>(ids)[i];
}

// bad[0] = max over bad positions i of n - i: n - (the first bad position), 0 when none.
__global__ void check_ids(const void* ids, bool i32, long long n, long long vocab, unsigned long long* bad) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long id = id_at(ids, i32, i);
    if (id < 0 || id >= vocab) atomicMax(bad, static_cast<unsigned long long>(n - i));
  }
}

template <class T>
__global__ void gather_rows(const void* ids, bool i32, const T* w, T* out, long long n, EmbeddingShape e) {
  const long long total = n * e.hidden;
  for (long long x = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; x < total;
       x += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long i = x / e.hidden, c = x % e.hidden, r = id_at(ids, i32, i) - e.offset;
    out[x] = r >= 0 && r < e.rows ? w[r * e.hidden + c] : T(0.0f);
  }
}

__global__ void make_pairs(const void* ids, bool i32, long long n, long long* keys, long long* positions) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    keys[i] = id_at(ids, i32, i);
    positions[i] = i;
  }
}

// Block k (grid-stride) takes sorted entry k when it starts a run of equal ids in this block of
// rows; its threads sum the run's dout rows column by column, in position order.
// bf16: the same float sums of the rows read as float, rounded once to bf16.
template <class T>
__global__ void sum_runs(const long long* keys, const long long* positions, const T* dout, T* dw, long long n,
                         EmbeddingShape e) {
  for (long long k = blockIdx.x; k < n; k += gridDim.x) {
    const long long id = keys[k], r = id - e.offset;
    if ((k > 0 && keys[k - 1] == id) || r < 0 || r >= e.rows) continue;
    for (long long c = threadIdx.x; c < e.hidden; c += blockDim.x) {
      float sum = 0.0f;
      for (long long m = k; m < n && keys[m] == id; ++m) sum += detail::to_f(dout[positions[m] * e.hidden + c]);
      dw[r * e.hidden + c] = detail::from_f<T>(sum);
    }
  }
}

int bits_for(long long vocab) {
  int bits = 1;
  while (bits < 63 && (1ll << bits) < vocab) ++bits;
  return bits;
}

size_t sort_bytes(long long n, long long vocab) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const long long*>(nullptr),
                                  static_cast<long long*>(nullptr), static_cast<const long long*>(nullptr),
                                  static_cast<long long*>(nullptr), static_cast<int>(n), 0, bits_for(vocab));
  return (bytes + 255) / 256 * 256;
}

}  // namespace

int embedding_check_ids(const void* ids, bool ids_i32, int64_t n, int64_t vocab_size, int64_t* bad, void* s) {
  if (n == 0) return cudaSuccess;
  check_ids<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(ids, ids_i32, n, vocab_size,
                                                                      reinterpret_cast<unsigned long long*>(bad));
  return cudaGetLastError();
}

int embedding_forward(Elem el, const void* ids, bool ids_i32, int64_t n, const void* weight, void* out,
                      const EmbeddingShape& e, void* s) {
  if (n == 0 || e.hidden == 0) return cudaSuccess;
  auto stream = static_cast<cudaStream_t>(s);
  const unsigned grid = grid_for(n * e.hidden);
  if (el == Elem::F32) {
    gather_rows<<<grid, kBlock, 0, stream>>>(ids, ids_i32, static_cast<const float*>(weight), static_cast<float*>(out),
                                             n, e);
  } else {
    gather_rows<<<grid, kBlock, 0, stream>>>(ids, ids_i32, static_cast<const __nv_bfloat16*>(weight),
                                             static_cast<__nv_bfloat16*>(out), n, e);
  }
  return cudaGetLastError();
}

size_t embedding_backward_scratch_bytes(int64_t n, int64_t vocab_size) {
  return sort_bytes(n, vocab_size) + 4 * sizeof(long long) * static_cast<size_t>(n);
}

int embedding_backward(Elem el, const void* ids, bool ids_i32, int64_t n, const void* dout, void* dweight,
                       const EmbeddingShape& e, int64_t vocab_size, void* scratch, void* s) {
  auto stream = static_cast<cudaStream_t>(s);
  const size_t elem_bytes = el == Elem::F32 ? sizeof(float) : sizeof(__nv_bfloat16);
  cudaError_t err = cudaMemsetAsync(dweight, 0, elem_bytes * static_cast<size_t>(e.rows * e.hidden), stream);
  if (err != cudaSuccess || n == 0 || e.hidden == 0) return err;
  size_t temp = sort_bytes(n, vocab_size);
  auto* keys = reinterpret_cast<long long*>(static_cast<char*>(scratch) + temp);
  long long *positions = keys + n, *sorted_keys = positions + n, *sorted_positions = sorted_keys + n;
  make_pairs<<<grid_for(n), kBlock, 0, stream>>>(ids, ids_i32, n, keys, positions);
  err = cub::DeviceRadixSort::SortPairs(scratch, temp, keys, sorted_keys, positions, sorted_positions,
                                        static_cast<int>(n), 0, bits_for(vocab_size), stream);
  if (err != cudaSuccess) return err;
  const unsigned grid = static_cast<unsigned>(n < 65536 * 8 ? n : 65536 * 8);
  if (el == Elem::F32) {
    sum_runs<<<grid, 128, 0, stream>>>(sorted_keys, sorted_positions, static_cast<const float*>(dout),
                                       static_cast<float*>(dweight), n, e);
  } else {
    sum_runs<<<grid, 128, 0, stream>>>(sorted_keys, sorted_positions, static_cast<const __nv_bfloat16*>(dout),
                                       static_cast<__nv_bfloat16*>(dweight), n, e);
  }
  return cudaGetLastError();
}

}  // namespace shardwise::cuda::launch
