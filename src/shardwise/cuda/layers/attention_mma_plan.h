#pragma once
// The index arithmetic of the tensor-core (wmma bf16 -> f32) flash attention
// (attention_mma.cuh, attention_mma_forward.cu, attention_mma_backward.cu), as plain functions that
// both the kernels and a CPU test (tests/cuda/test_cuda_attention_mma_plan.cc) use: the shared
// memory layout, the fragment offsets, which lanes own which softmax entries, the causal tile
// ranges and which calls take this path. C++17 (nvcc compiles it too); nothing here touches a GPU.
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#if defined(__CUDACC__)
#define SW_MMA_HD __host__ __device__
#else
#define SW_MMA_HD
#endif

namespace shardwise::cuda::mma_plan {

inline constexpr int kTile = 64;               // query rows and keys per tile
inline constexpr int kWarps = 4;               // warp w owns tile rows [16 w, 16 w + 16)
inline constexpr int kThreads = 32 * kWarps;   // a block
inline constexpr int kFrag = 16;               // wmma m16n16k16 (bf16 operands, f32 accumulators)
inline constexpr int kWarpRows = kTile / kWarps;  // 16: one fragment row
inline constexpr size_t kAlign = 128;          // every shared memory region starts 128-byte aligned

// The head dims with a tensor-core kernel (others, and f32, run the FMA kernel).
SW_MMA_HD constexpr bool supported_head_dim(int64_t d) { return d == 64 || d == 128; }

// Row strides in elements. bf16 rows are padded by 8 (16 bytes) and f32 rows by 4 (16 bytes): wmma
// needs ldm a multiple of 8 (bf16) or 4 (f32) and 32-byte aligned fragment pointers, and the padding
// moves consecutive rows onto other banks.
SW_MMA_HD constexpr int ld_bf16(int cols) { return cols + 8; }
SW_MMA_HD constexpr int ld_f32(int cols) { return cols + 4; }

// The element offset of the fragment at (row, col) of a row-major tile with row stride ld; rows and
// cols are multiples of 16 in every use, so with ld_bf16 / ld_f32 the byte offset is a multiple of 32.
SW_MMA_HD constexpr int frag_at(int ld, int row, int col) { return row * ld + col; }

// The softmax (and dS) step: lane l of a warp owns row l / 2 of the warp's 16 and the 32 columns
// [32 (l % 2), 32 (l % 2) + 32) of the 64 keys; the two lanes of a row combine by shfl_xor(1).
// The accumulator rows (O, dQ, dK, dV) split the same way over the head dim: cols
// [(l % 2) D / 2, (l % 2 + 1) D / 2).
SW_MMA_HD constexpr int lane_row(int lane) { return lane >> 1; }
SW_MMA_HD constexpr int lane_col0(int lane, int cols) { return (lane & 1) * (cols / 2); }

// Causal tile ranges (tiles start at multiples of kTile). The query tile at i0 with ni rows sees
// keys j < i0 + ni: key tiles j0 = 0, kTile, ... below that. The key tile at j0 is seen by query
// rows i >= j0: query tiles from the one holding j0, which starts at j0 itself.
SW_MMA_HD constexpr int64_t key_end(int64_t i0, int ni) { return i0 + ni; }
SW_MMA_HD constexpr int64_t first_query_tile(int64_t j0) { return j0; }
SW_MMA_HD constexpr int tile_rows(int64_t start, int64_t seq) {
  return static_cast<int>(seq - start < kTile ? seq - start : kTile);
}

// Byte offsets of a kernel's shared memory regions (each kAlign-aligned) and the total.
struct Layout {
  size_t at = 0;
  SW_MMA_HD constexpr size_t take(size_t bytes) {
    const size_t start = at;
    at = (at + bytes + kAlign - 1) / kAlign * kAlign;
    return start;
  }
  // A region of `bytes` for each non-null offset given, in order.
  SW_MMA_HD constexpr void take_each(size_t bytes, size_t* a, size_t* b = nullptr, size_t* c = nullptr,
                                     size_t* d = nullptr) {
    size_t* const all[4] = {a, b, c, d};
    for (size_t* const at_of : all) {
      if (at_of != nullptr) *at_of = take(bytes);
    }
  }
};
SW_MMA_HD constexpr size_t bf16_tile_bytes(int cols) { return size_t{2} * kTile * ld_bf16(cols); }
SW_MMA_HD constexpr size_t f32_tile_bytes(int cols) { return size_t{4} * kTile * ld_f32(cols); }

// The forward: Q, K, V [64, D] bf16; S [64, 64] f32 scores; P [64, 64] bf16 probabilities; O [64, D]
// f32 running output.
struct ForwardSmem {
  size_t q, k, v, s, p, o, total;
};
SW_MMA_HD constexpr ForwardSmem forward_smem(int D) {
  Layout l;
  ForwardSmem m{};
  l.take_each(bf16_tile_bytes(D), &m.q, &m.k, &m.v);
  l.take_each(f32_tile_bytes(kTile), &m.s);
  l.take_each(bf16_tile_bytes(kTile), &m.p);
  l.take_each(f32_tile_bytes(D), &m.o);
  m.total = l.at;
  return m;
}

// The backward passes: Q, dO, K, V [64, D] bf16; S and dP [64, 64] f32; P and dS [64, 64] bf16;
// the accumulators acc0 (dK, or dQ) and acc1 (dV; dkdv only) [64, D] f32; lse and delta [64] f32.
struct BackwardSmem {
  size_t q, dout, k, v, s, dp, p, ds, acc0, acc1, lse, delta, total;
};
SW_MMA_HD constexpr BackwardSmem backward_smem(int D, bool dkdv) {
  Layout l;
  BackwardSmem m{};
  l.take_each(bf16_tile_bytes(D), &m.q, &m.dout, &m.k, &m.v);
  l.take_each(f32_tile_bytes(kTile), &m.s, &m.dp);
  l.take_each(bf16_tile_bytes(kTile), dkdv ? &m.p : nullptr, &m.ds);  // dq needs no P: dS is all it multiplies
  l.take_each(f32_tile_bytes(D), &m.acc0, dkdv ? &m.acc1 : nullptr);
  l.take_each(sizeof(float) * kTile, &m.lse, &m.delta);
  m.total = l.at;
  return m;
}

// The most dynamic shared memory a block may ask for on sm_90 (227 KiB).
inline constexpr size_t kMaxSmem = 227 * 1024;

// Whether a call takes the tensor-core kernels: bf16, a supported head dim, and every pointer
// 16-byte aligned (the tiles load 8 bf16 at a time).
inline bool use_tensor_cores(bool bf16, int64_t head_dim, std::initializer_list<const void*> ptrs) {
  if (!bf16 || !supported_head_dim(head_dim)) return false;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace shardwise::cuda::mma_plan
