// The storage cache (tensor/allocator.h): large blocks freed by tensors are reused, never handed
// back to the system while the process runs; class sizes waste at most 12.5%; reused blocks are
// zeroed when a zeroed tensor asks; huge blocks are 2 MiB aligned; rank threads share the cache.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "shardwise/tensor/allocator.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise {
namespace {

TEST(Allocator, ClassSizesArePagesAndWasteAtMostAnEighth) {
  for (size_t bytes : {size_t{1} << 20, (size_t{1} << 20) + 1, size_t{3'000'001}, size_t{64} << 20,
                       (size_t{64} << 20) + 12345, size_t{411'000'000}}) {
    const size_t c = storage_class_size(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_EQ(c % 4096, 0u);
    EXPECT_LE(static_cast<double>(c), 1.125 * static_cast<double>(bytes) + 4096) << bytes;
  }
  // Requests of one class get one size: a freed block serves the next.
  EXPECT_EQ(storage_class_size((size_t{64} << 20) + 1), storage_class_size((size_t{64} << 20) + 4096));
}

TEST(Allocator, AFreedLargeBlockServesTheNextRequestOfItsClass) {
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
