// The stand-in a kernel gets for a released buffer it reads the shape of (stand_in.h:
// shape_only_tensor): from 1 MiB up it takes nothing from the tensor allocator and commits no
// memory, even after it is read (the zero page); a smaller one is an ordinary tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "shardwise/runtime/stand_in.h"
#include "shardwise/tensor/allocator.h"

namespace shardwise::runtime {
namespace {

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(ShapeOnlyTensor, ALargeOneHoldsNoMemoryAndReadsAsZeros) {
  Tensor warm = Tensor::uninitialized(DType::F32, Shape{1024, 1024});  // a freed 4 MiB range in the cache
  warm = Tensor();
  const AllocatorStats before = allocator_stats();
  const int64_t resident = resident_bytes();
  Tensor t = shape_only_tensor(DType::F32, Shape{1024, 1024});
  EXPECT_EQ(t.shape(), (Shape{1024, 1024}));
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(allocator_stats().in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(allocator_stats().cached_bytes, before.cached_bytes);  // the cached range stays free
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); i += 1024) sum += t.data<float>()[i];
  EXPECT_EQ(sum, 0.0);
  EXPECT_LT(resident_bytes() - resident, int64_t{1} << 20);
  const Tensor small = shape_only_tensor(DType::BF16, Shape{3, 5});
  EXPECT_EQ(small.shape(), (Shape{3, 5}));
  EXPECT_EQ(small.dtype(), DType::BF16);
}

}  // namespace
}  // namespace shardwise::runtime
