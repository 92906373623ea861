// The index arithmetic of the tensor-core attention (cuda/layers/attention_mma_plan.h), on the CPU:
// the shared memory regions are aligned, disjoint and fit sm_90; every fragment the kernels load or
// store starts 32-byte aligned with a legal row stride; the lanes' softmax and accumulator rows
// cover each tile entry once; the causal tile ranges of the forward and dq (key tiles per query
// tile) and of dk/dv (query tiles per key tile) visit the same tile pairs, every visible pair in
// one of them and no tile without one; which calls take the path; and forcing it where it does not
// apply is an Error naming why, before any launch (on a fake device as cuda:7).
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "shardwise/cuda/layers/attention.h"
#include "shardwise/cuda/layers/attention_mma_plan.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/error_of.h"

namespace shardwise::cuda::mma_plan {
namespace {

// The regions as (offset, bytes) pairs are each kAlign-aligned, in order and disjoint, below total.
void expect_regions(const std::vector<std::pair<size_t, size_t>>& regions, size_t total, const std::string& what) {
  size_t end = 0;
  for (const auto& [at, bytes] : regions) {
    EXPECT_EQ(at % kAlign, 0u) << what;
    EXPECT_GE(at, end) << what << ": regions overlap";
    end = at + bytes;
  }
  EXPECT_LE(end, total) << what;
  EXPECT_LE(total, kMaxSmem) << what << ": over sm_90's 227 KiB";
}

TEST(AttentionMmaPlan, SharedMemoryRegionsAreAlignedDisjointAndFit) {
  for (const int D : {64, 128}) {
    const ForwardSmem f = forward_smem(D);
    expect_regions({{f.q, bf16_tile_bytes(D)}, {f.k, bf16_tile_bytes(D)}, {f.v, bf16_tile_bytes(D)},
                    {f.s, f32_tile_bytes(kTile)}, {f.p, bf16_tile_bytes(kTile)}, {f.o, f32_tile_bytes(D)}},
                   f.total, "forward D " + std::to_string(D));
    for (const bool dkdv : {true, false}) {
      const BackwardSmem b = backward_smem(D, dkdv);
      std::vector<std::pair<size_t, size_t>> r{{b.q, bf16_tile_bytes(D)},    {b.dout, bf16_tile_bytes(D)},
                                               {b.k, bf16_tile_bytes(D)},    {b.v, bf16_tile_bytes(D)},
                                               {b.s, f32_tile_bytes(kTile)}, {b.dp, f32_tile_bytes(kTile)}};
      if (dkdv) r.emplace_back(b.p, bf16_tile_bytes(kTile));
      r.emplace_back(b.ds, bf16_tile_bytes(kTile));
      r.emplace_back(b.acc0, f32_tile_bytes(D));
      if (dkdv) r.emplace_back(b.acc1, f32_tile_bytes(D));
      r.emplace_back(b.lse, 4 * kTile);
      r.emplace_back(b.delta, 4 * kTile);
      expect_regions(r, b.total, (dkdv ? "dkdv D " : "dq D ") + std::to_string(D));
    }
  }
  EXPECT_EQ(forward_smem(128).total, 112640u);  // 3 x 17408 (Q, K, V) + 17408 (S) + 9216 (P) + 33792 (O)
}

// Every fragment pointer: tile base (kAlign-aligned) + frag_at(ld, row, col) elements with row and
// col multiples of 16 (warp_abt, warp_acc_ab, and the col-major A at column w0 = 16 w).
TEST(AttentionMmaPlan, FragmentsStart32ByteAlignedWithLegalStrides) {
  for (const int cols : {64, 128}) {
    EXPECT_EQ(ld_bf16(cols) % 8, 0) << "wmma: a bf16 ldm is a multiple of 8";
    EXPECT_EQ(ld_f32(cols) % 4, 0) << "wmma: an f32 ldm is a multiple of 4";
    for (int row = 0; row < kTile; row += kFrag) {
      for (int col = 0; col < cols; col += kFrag) {
        EXPECT_EQ(frag_at(ld_bf16(cols), row, col) * 2 % 32, 0) << row << "," << col;
        EXPECT_EQ(frag_at(ld_f32(cols), row, col) * 4 % 32, 0) << row << "," << col;
      }
    }
    EXPECT_EQ(ld_bf16(cols) * 2 % 16, 0) << "a tile row starts 16-byte aligned (the 8-element loads)";
  }
}

// Lane l of warp w: row 16 w + lane_row(l), columns [lane_col0(l, n), + n / 2) of n.
TEST(AttentionMmaPlan, TheLanesCoverEveryTileEntryOnce) {
  for (const int n : {64, 128}) {
    std::vector<int> seen(static_cast<size_t>(kTile * n), 0);
    for (int w = 0; w < kWarps; ++w) {
      for (int lane = 0; lane < 32; ++lane) {
        const int row = w * kWarpRows + lane_row(lane);
        EXPECT_EQ(lane_row(lane), lane_row(lane ^ 1)) << "the two lanes of a row differ by bit 0 (shfl_xor 1)";
        for (int c = lane_col0(lane, n); c < lane_col0(lane, n) + n / 2; ++c) ++seen[static_cast<size_t>(row * n + c)];
      }
    }
    for (int e = 0; e < kTile * n; ++e) ASSERT_EQ(seen[static_cast<size_t>(e)], 1) << "entry " << e << " of " << n;
  }
}

TEST(AttentionMmaPlan, CausalTileRangesAgreeAndCoverEveryVisiblePair) {
  for (const int64_t S : {1, 31, 63, 64, 65, 100, 129, 200}) {
    std::set<std::pair<int64_t, int64_t>> by_query, by_key;  // (i0, j0)
    for (int64_t i0 = 0; i0 < S; i0 += kTile) {
      for (int64_t j0 = 0; j0 < key_end(i0, tile_rows(i0, S)); j0 += kTile) by_query.insert({i0, j0});
    }
    for (int64_t j0 = 0; j0 < S; j0 += kTile) {
      for (int64_t i0 = first_query_tile(j0); i0 < S; i0 += kTile) by_key.insert({i0, j0});
    }
    EXPECT_EQ(by_query, by_key) << "S " << S;
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t j = 0; j <= i; ++j) ASSERT_TRUE(by_query.contains({i / kTile * kTile, j / kTile * kTile})) << i << "," << j;
    }
    for (const auto& [i0, j0] : by_query) EXPECT_LE(j0, i0 + tile_rows(i0, S) - 1) << "a tile with no visible pair";
    EXPECT_EQ(tile_rows((S - 1) / kTile * kTile, S), (S - 1) % kTile + 1);
  }
}

TEST(AttentionMmaPlan, Bf16WithHeadDim64Or128AndAlignedPointersTakeTheTensorCores) {
  alignas(16) static char buffer[64];
  EXPECT_TRUE(use_tensor_cores(true, 64, {buffer, buffer + 16}));
  EXPECT_TRUE(use_tensor_cores(true, 128, {buffer}));
  EXPECT_FALSE(use_tensor_cores(false, 64, {buffer}));  // f32
  EXPECT_FALSE(use_tensor_cores(true, 24, {buffer}));
  EXPECT_FALSE(use_tensor_cores(true, 96, {buffer}));
  EXPECT_FALSE(use_tensor_cores(true, 64, {buffer, buffer + 2}));  // a view 2 bytes in
}

TEST(AttentionMmaPlan, ForcingTheTensorCoresWhereTheyDoNotApplyNamesWhy) {
  register_fake_device({.index = 7});
  const Device fake = Device::cuda(7);
  const Tensor f32 = to_device(Tensor::full(DType::F32, Shape{1, 1, 5, 64}, 0.5), fake);
  const std::string e = error_of([&] { flash_attention(f32, f32, f32, Tensor(), 0.125, {}, AttentionPath::TensorCore); });
  EXPECT_NE(e.find("the tensor-core kernel takes bf16 with head dim 64 or 128"), std::string::npos) << e;
  EXPECT_NE(e.find("got f32 with head dim 64"), std::string::npos) << e;
  const Tensor d24 = to_device(Tensor::full(DType::F32, Shape{1, 1, 5, 24}, 0.5).to(DType::BF16), fake);
  const std::string e24 = error_of([&] { flash_attention(d24, d24, d24, Tensor(), 0.2, {}, AttentionPath::TensorCore); });
  EXPECT_NE(e24.find("got bf16 with head dim 24"), std::string::npos) << e24;
}

}  // namespace
}  // namespace shardwise::cuda::mma_plan
