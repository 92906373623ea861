// The CUDA device memory backend (cuda/cuda_memory.h) under the tensor layer's devices: copies
// round-trip bit for bit, the caching allocator reuses freed blocks on a real GPU, a block another
// stream used waits for that stream's event. Skipped, with the reason, where no GPU is present.
#include "cuda_test_util.h"

#include "shardwise/tensor/device_allocator.h"

namespace shardwise::cuda_test {
namespace {

using CudaMemory = Gpu;

TEST_F(CudaMemory, ToDeviceAndBackIsBitExact) {
  for (int64_t n : {1, 7, 4097, (1 << 20) + 3}) {
    const Tensor host = random_f32(Shape{n}, static_cast<unsigned>(n));
    const Tensor back = to_host(to_device(host, kGpu));
    EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0) << n;
  }
  const Tensor z = to_host(zeros_on(DType::F32, Shape{3, 1001}, kGpu));
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.at(i), 0.0);
}

TEST_F(CudaMemory, TheAllocatorReusesAFreedBlockOnItsStream) {
  DeviceAllocator& a = device_allocator(kGpu);
  const int64_t hits = a.stats().hits;
  const void* first = nullptr;
  { first = empty_on(DType::F32, Shape{12345}, kGpu).device_ptr(); }
  const Tensor again = empty_on(DType::F32, Shape{12340}, kGpu);
  EXPECT_EQ(again.device_ptr(), first);
  EXPECT_EQ(a.stats().hits, hits + 1);
}

TEST_F(CudaMemory, ABlockUsedOnAnotherStreamWaitsForIt) {
  DeviceAllocator& a = device_allocator(kGpu);
  const Stream other = cuda::create_stream(kGpu);
  void* p = a.allocate(1 << 20, {});
  a.record_use(p, other);
  a.free(p);
  cuda::synchronize(kGpu, other);
  void* q = a.allocate(1 << 20, {});  // the event has passed once `other` is idle
  EXPECT_EQ(q, p);
  a.free(q);
  cuda::destroy_stream(kGpu, other);
}

}  // namespace
}  // namespace shardwise::cuda_test
