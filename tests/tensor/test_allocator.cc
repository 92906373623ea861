// The storage cache (tensor/allocator.h): large blocks freed by tensors are reused, never handed
// back to the system while the process runs; requests are cut best fit from freed ranges, which join
// their neighbours; reused blocks are zeroed when a zeroed tensor asks; huge blocks are 2 MiB
// aligned; rank threads share the cache.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shardwise/tensor/allocator.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise {
namespace {

TEST(Allocator, RequestsAreWholePages) {
  for (size_t bytes : {size_t{1} << 20, (size_t{1} << 20) + 1, size_t{3'000'001}, size_t{411'000'000}}) {
    const size_t r = storage_request_size(bytes);
    EXPECT_GE(r, bytes);
    EXPECT_EQ(r % 4096, 0u);
    EXPECT_LT(r - bytes, 4096u);
  }
}

constexpr size_t kMiB = size_t{1} << 20;

Tensor bytes_tensor(size_t bytes) { return Tensor::uninitialized(DType::U8, Shape{static_cast<int64_t>(bytes)}); }

TEST(Allocator, ASmallerRequestIsCutFromAFreedBlockAndTheRestStaysFree) {
  release_cached_storage();  // no free range left by other tests: best fit is predictable
  const std::byte* base = nullptr;
  { base = bytes_tensor(8 * kMiB).raw(); }
  const AllocatorStats before = allocator_stats();
  Tensor a = bytes_tensor(3 * kMiB);
  Tensor b = bytes_tensor(5 * kMiB);
  EXPECT_EQ(a.raw(), base);
  EXPECT_EQ(b.raw(), base + 3 * kMiB);
  const AllocatorStats after = allocator_stats();
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);  // both from the one freed block
  EXPECT_EQ(after.reused, before.reused + 2);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes - static_cast<int64_t>(8 * kMiB));
}

TEST(Allocator, FreedNeighboursJoinAndServeALargerRequest) {
  release_cached_storage();
  const AllocatorStats start = allocator_stats();
  { Tensor big = bytes_tensor(40 * kMiB); }  // a step's large buffer...
  for (int step = 0; step < 5; ++step) {
    const std::byte* big_at = nullptr;
    {
      std::vector<Tensor> pieces;  // ...then four smaller ones cut from it...
      for (int i = 0; i < 4; ++i) pieces.push_back(bytes_tensor(10 * kMiB));
      EXPECT_EQ(allocator_stats().reserved_bytes - start.reserved_bytes, static_cast<int64_t>(40 * kMiB)) << step;
    }
    {
      Tensor big = bytes_tensor(40 * kMiB);  // ...which, freed, join into it again
      big_at = big.raw();
    }
    EXPECT_NE(big_at, nullptr);
  }
  // A cache keyed by size would hold 80 MiB here (the 40 MiB block and four 10 MiB ones).
  EXPECT_EQ(allocator_stats().reserved_bytes - start.reserved_bytes, static_cast<int64_t>(40 * kMiB));
}

TEST(Allocator, AReusedBlockIsZeroedWhenAZeroedTensorAsks) {
  release_cached_storage();
  { Tensor dirty = bytes_tensor(6 * kMiB); std::memset(dirty.raw(), 0x5a, dirty.nbytes()); }
  Tensor zeroed(DType::F32, Shape{1024, 1024});  // 4 MiB cut from the dirty 6
  EXPECT_EQ(allocator_stats().cached_bytes, static_cast<int64_t>(2 * kMiB));
  for (int64_t i = 0; i < zeroed.numel(); i += 4099) ASSERT_EQ(zeroed.data<float>()[i], 0.0f) << i;
  EXPECT_EQ(zeroed.data<float>()[zeroed.numel() - 1], 0.0f);
}

TEST(Allocator, AFreedLargeBlockServesTheNextRequestOfItsSize) {
  const Shape shape{1024, 1024};  // 4 MiB of f32
  const std::byte* first = nullptr;
  {
    Tensor t = Tensor::uninitialized(DType::F32, shape);
    first = t.raw();
    std::memset(t.raw(), 0x5a, t.nbytes());
  }
  const AllocatorStats before = allocator_stats();
  Tensor again(DType::F32, shape);  // zeroed: the reused block must be cleared
  const AllocatorStats after = allocator_stats();
  EXPECT_EQ(again.raw(), first);
  EXPECT_EQ(after.reused, before.reused + 1);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);  // nothing new from the system
  for (int64_t i = 0; i < again.numel(); i += 4099) ASSERT_EQ(again.data<float>()[i], 0.0f) << i;
  EXPECT_EQ(again.data<float>()[again.numel() - 1], 0.0f);
  EXPECT_GE(after.peak_in_use_bytes, after.in_use_bytes);
}

TEST(Allocator, SmallBlocksStayOnTheHeapAndHugeOnesAreAligned) {
  const AllocatorStats before = allocator_stats();
  Tensor small(DType::F32, Shape{1000});
  EXPECT_EQ(allocator_stats().requests, before.requests);
  Tensor huge = Tensor::uninitialized(DType::F32, Shape{3, 1024, 1024}, /*huge_pages=*/true);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(huge.raw()) % (size_t{2} << 20), 0u);
}

// Pages of [p, p + n) resident now (mincore).
size_t resident_pages(const std::byte* p, size_t n) {
  std::vector<unsigned char> in(n / 4096);
  if (::mincore(const_cast<std::byte*>(p), n, in.data()) != 0) return SIZE_MAX;
  size_t count = 0;
  for (unsigned char c : in) count += c & 1;
  return count;
}

TEST(Allocator, AHugeBlocksTailPastItsLastWhole2MiBHoldsOnlyTheTouchedPages) {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
  if (modes.empty() || modes.find("[never]") != std::string::npos) GTEST_SKIP() << "no transparent huge pages here";
  // 14 MiB + 3 pages, rounded to a 16 MiB huge block (a size no other test asks for: a fresh
  // mapping). Every used byte written: the 3 pages past 14 MiB are resident, not the 2 MiB page
  // that would hold them.
  const size_t bytes = 14 * kMiB + 3 * 4096;
  std::shared_ptr<std::byte[]> block = allocate_storage(bytes, /*zero=*/false, /*huge=*/true);
  std::memset(block.get(), 1, bytes);
  EXPECT_EQ(resident_pages(block.get() + 14 * kMiB, 2 * kMiB), 3u);
}

TEST(Allocator, RankThreadsShareTheCacheSafely) {
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([r] {
      for (int step = 0; step < 50; ++step) {
        Tensor a(DType::F32, Shape{300 + r, 1024});
        Tensor b = Tensor::full(DType::F32, Shape{512, 1024 + step % 3}, r);
        ASSERT_EQ(a.data<float>()[a.numel() - 1], 0.0f);
        ASSERT_EQ(b.data<float>()[b.numel() - 1], static_cast<float>(r));
      }
    });
  }
  for (auto& t : threads) t.join();
  const AllocatorStats s = allocator_stats();
  EXPECT_GT(s.reused, 0);
  release_cached_storage();
  const AllocatorStats released = allocator_stats();
  EXPECT_EQ(released.cached_bytes, 0);
  EXPECT_EQ(released.reserved_bytes, released.in_use_bytes);
}

}  // namespace
}  // namespace shardwise
