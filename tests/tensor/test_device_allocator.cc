// The caching device allocator (tensor/device_allocator.h) on the fake device (no GPU): size
// classes, reuse on the same stream only, blocks used by another stream held until its event has
// passed, the cache emptied when the device is full, and the statistics counted exactly.
#include <gtest/gtest.h>

#include <string>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/fake_device.h"

namespace shardwise {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
const Stream s0{nullptr};
const Stream s1{reinterpret_cast<void*>(1)};

TEST(DeviceAllocator, SizeClassesRoundTo512BytesThenToAQuarterOfThePowerOfTwo) {
  EXPECT_EQ(DeviceAllocator::size_class(0), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(1), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(512), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(513), 1024u);
  EXPECT_EQ(DeviceAllocator::size_class(kMiB - 1), kMiB);
  EXPECT_EQ(DeviceAllocator::size_class(kMiB), kMiB);
  EXPECT_EQ(DeviceAllocator::size_class(kMiB + 1), kMiB + kMiB / 4);
  EXPECT_EQ(DeviceAllocator::size_class(3 * kMiB), 3 * kMiB);
  EXPECT_EQ(DeviceAllocator::size_class(3 * kMiB + 1), 3 * kMiB + kMiB / 2);
}

TEST(DeviceAllocator, AFreedBlockServesTheNextRequestOfItsClassOnItsStream) {
  FakeDeviceMemory fake({});
  DeviceAllocator a(fake);
  void* p = a.allocate(1000, s0);
  DeviceAllocatorStats st = a.stats();
  EXPECT_EQ(st.in_use_bytes, 1024);
  EXPECT_EQ(st.reserved_bytes, 1024);
  a.free(p);
  st = a.stats();
  EXPECT_EQ(st.in_use_bytes, 0);
  EXPECT_EQ(st.cached_bytes, 1024);
  EXPECT_EQ(a.allocate(900, s0), p);  // same class, same stream: the cached block
  void* q = a.allocate(3000, s0);     // another class: a fresh block
  EXPECT_NE(q, p);
  st = a.stats();
  EXPECT_EQ(st.allocations, 3);
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.device_allocations, 2);
  EXPECT_EQ(st.in_use_bytes, 1024 + 3072);
  EXPECT_EQ(st.peak_in_use_bytes, 1024 + 3072);
  EXPECT_EQ(st.cached_bytes, 0);
  a.free(q);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_in_use_bytes, 1024);
  a.free(p);
}

TEST(DeviceAllocator, ABlockFreedOnOneStreamIsNotReusedOnAnother) {
  FakeDeviceMemory fake({});
  DeviceAllocator a(fake);
  void* p = a.allocate(4096, s0);
  a.free(p);
  void* q = a.allocate(4096, s1);
  EXPECT_NE(q, p);
  EXPECT_EQ(a.stats().hits, 0);
  a.free(q);
}

TEST(DeviceAllocator, ABlockAnotherStreamUsedWaitsForThatStreamsEvent) {
  FakeDeviceMemory fake({});
  DeviceAllocator a(fake);
  fake.hold_events(true);
  void* p = a.allocate(8192, s0);
  a.record_use(p, s1);
  a.free(p);  // s1's work may still read it: pending
  EXPECT_EQ(a.stats().cached_bytes, 8192);
  void* q = a.allocate(8192, s0);
  EXPECT_NE(q, p);
  EXPECT_EQ(fake.live_events(), 1u);
  fake.complete_events();
  a.free(q);
  void* r = a.allocate(8192, s0);  // the event has passed: p is cached now (and q on top of it)
  EXPECT_EQ(a.stats().hits, 1);
  EXPECT_TRUE(r == p || r == q);
  EXPECT_EQ(fake.live_events(), 0u);  // released once passed
  a.free(r);
}

TEST(DeviceAllocator, AFullDeviceEmptiesTheCacheThenNamesTheShortfall) {
  FakeDeviceMemory fake({.capacity = 8192});
  DeviceAllocator a(fake);
  fake.hold_events(true);
  void* p = a.allocate(4096, s0);
  a.record_use(p, s1);
  a.free(p);  // pending on s1: emptying the cache synchronises s1 first
  void* big = a.allocate(8192, s0);
  DeviceAllocatorStats st = a.stats();
  EXPECT_EQ(st.device_frees, 1);
  EXPECT_EQ(st.cached_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, 8192);
  EXPECT_EQ(fake.bytes_mapped(), 8192u);
  try {
    a.allocate(100, s0);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 is out of memory: 512 bytes asked for (8192 in use"), std::string::npos) << e.what();
  }
  a.free(big);
}

TEST(DeviceAllocator, ReleaseCachedGivesEveryFreedBlockBack) {
  FakeDeviceMemory fake({});
  DeviceAllocator a(fake);
  void* p = a.allocate(5000, s0);
  void* q = a.allocate(2 * kMiB, s1);
  a.free(p);
  a.free(q);
  EXPECT_GT(fake.bytes_mapped(), 2 * kMiB);
  a.release_cached();
  EXPECT_EQ(fake.bytes_mapped(), 0u);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(a.stats().device_frees, 2);
}

TEST(DeviceAllocator, FreeingAnUnknownPointerIsAnError) {
  FakeDeviceMemory fake({});
  DeviceAllocator a(fake);
  int x = 0;
  EXPECT_THROW(a.free(&x), Error);
}

}  // namespace
}  // namespace shardwise
