// The staging pool (tensor/staging_pool.h): host buffers for device copies, page-locked where the
// backend gives such memory and plain host memory where it does not (the fake device), reused by
// the next request they fit, freed beyond the pool's limit; and the copies between a device tensor
// and a staging buffer (device_copy.h), exact, counted, and refused when the sizes differ.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "shardwise/tensor/staging_pool.h"

namespace shardwise {
namespace {

// A fake device whose backend gives "pinned" host memory, counting what it gives and takes back.
class PinnedFake : public FakeDeviceMemory {
 public:
  using FakeDeviceMemory::FakeDeviceMemory;
  void* allocate_pinned(size_t bytes) override {
    ++given;
    return std::malloc(bytes);
  }
  void free_pinned(void* ptr) override {
    ++taken;
    std::free(ptr);
  }
  int given = 0, taken = 0;
};

TEST(StagingPool, TheFakeDevicesBuffersArePlainHostMemoryReusedByTheNextRequestTheyFit) {
  register_fake_device({.index = 11});
  const StagingPoolStats before = staging_pool_stats();
  std::byte* first = nullptr;
  {
    StagingBuffer b = staging_buffer(Device::cuda(11), 10000);
    EXPECT_FALSE(b.pinned());
    EXPECT_EQ(b.size(), 10000u);
    EXPECT_GE(b.capacity(), 10000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
    std::memset(b.data(), 1, b.size());  // host memory: writable
    first = b.data();
  }
  StagingBuffer again = staging_buffer(Device::cuda(11), 9000);
  EXPECT_EQ(again.data(), first);
  const StagingPoolStats after = staging_pool_stats();
  EXPECT_EQ(after.allocations - before.allocations, 1);
  EXPECT_EQ(after.reuses - before.reuses, 1);
  EXPECT_EQ(after.pinned_bytes, before.pinned_bytes);
  StagingBuffer bigger = staging_buffer(Device::cuda(11), 20000);  // does not fit the free blocks
  EXPECT_NE(bigger.data(), first);
  EXPECT_EQ(staging_pool_stats().allocations - before.allocations, 2);
}

TEST(StagingPool, PinnedBlocksComeFromTheBackendAndGoBackToItBeyondTheLimit) {
  auto owned = std::make_unique<PinnedFake>(FakeDeviceMemory::Options{.index = 12});
  PinnedFake* backend = owned.get();
  register_device_memory(std::move(owned));
  const size_t limit = staging_pool_limit();
  set_staging_pool_limit(0);  // no free block of another test's device in the way
  set_staging_pool_limit(limit);
  {
    StagingBuffer a = staging_buffer(Device::cuda(12), 5000);
    StagingBuffer b = staging_buffer(Device::cuda(12), 5000);
    EXPECT_TRUE(a.pinned());
    EXPECT_EQ(backend->given, 2);
    EXPECT_GE(staging_pool_stats().pinned_bytes, 2 * a.capacity());
    set_staging_pool_limit(a.capacity());  // one block may stay free
  }
  EXPECT_EQ(backend->taken, 1);
  set_staging_pool_limit(limit);
  empty_staging_pool(Device::cuda(12));
  EXPECT_EQ(backend->taken, 2);
  StagingBuffer host = staging_buffer(Device::host(), 100);
  EXPECT_FALSE(host.pinned());  // the host's buffers never ask a backend
  EXPECT_EQ(backend->given, 2);
}

TEST(StagingPool, CopiesThroughAStagingBufferAreExactCountedAndSized) {
  register_fake_device({.index = 13});
  std::vector<float> values(1031);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.37f - 11.f;
  const Tensor host = Tensor::from<float>(Shape{1031}, values);
  Tensor dev = empty_on(DType::F32, Shape{1031}, Device::cuda(13));
  reset_device_copy_stats();
  StagingBuffer buf = staging_buffer(Device::cuda(13), host.nbytes());
  std::memcpy(buf.data(), host.raw(), host.nbytes());
  copy_from_host(buf.bytes(), dev);
  std::memset(buf.data(), 0, buf.size());
  copy_to_host(dev, buf.bytes());
  EXPECT_EQ(std::memcmp(buf.data(), host.raw(), host.nbytes()), 0);
  const DeviceCopyStats st = device_copy_stats();
  EXPECT_EQ(st.to_device_copies, 1);
  EXPECT_EQ(st.to_host_copies, 1);
  EXPECT_EQ(st.to_host_bytes, 1031 * 4);
  try {
    copy_to_host(dev, buf.bytes().first(100));
    FAIL() << "a 100-byte buffer took a 4124-byte tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 4124 bytes, the host buffer 100"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise
