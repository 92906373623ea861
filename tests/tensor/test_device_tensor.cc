// Device tensors on the fake device (tensor/fake_device.h, no GPU): the explicit copies round-trip
// bit for bit and are counted; storage goes back to the device allocator; and the host-access guard:
// host code asking a device tensor for its data gets an error naming the tensor, and a host pointer
// dereference of device memory dies (the fake device maps it PROT_NONE outside its copies).
#include <gtest/gtest.h>

#include <string>

#include <random>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"

namespace shardwise {
namespace {

const Device kFake = Device::cuda(7);

class DeviceTensor : public testing::Test {
 protected:
  void SetUp() override { fake_ = &register_fake_device({.index = 7}); }
  FakeDeviceMemory* fake_ = nullptr;
};

Tensor random_host(const Shape& shape, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(gen);
  return Tensor::from<float>(shape, v);
}

TEST_F(DeviceTensor, ToDeviceAndBackIsBitExactAndCounted) {
  reset_device_copy_stats();
  const Tensor host = random_host(Shape{37, 129}, 3);
  const Tensor dev = to_device(host, kFake);
  EXPECT_TRUE(dev.on_device());
  EXPECT_EQ(dev.device(), kFake);
  EXPECT_EQ(dev.shape(), host.shape());
  const Tensor back = to_host(dev);
  EXPECT_FALSE(back.on_device());
  EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0);
  const DeviceCopyStats st = device_copy_stats();
  EXPECT_EQ(st.to_device_copies, 1);
  EXPECT_EQ(st.to_device_bytes, 37 * 129 * 4);
  EXPECT_EQ(st.to_host_copies, 1);
  EXPECT_EQ(st.to_host_bytes, 37 * 129 * 4);
}

TEST_F(DeviceTensor, ZerosOnIsZeroAndAReshapedViewStaysOnTheDevice) {
  const Tensor z = zeros_on(DType::F32, Shape{5, 3}, kFake);
  const Tensor v = z.reshaped(Shape{15});
  EXPECT_EQ(v.device(), kFake);
  const Tensor back = to_host(v);
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(back.at(i), 0.0);
}

TEST_F(DeviceTensor, StorageGoesBackToTheDeviceAllocator) {
  DeviceAllocator& alloc = device_allocator(kFake);
  const int64_t before = alloc.stats().in_use_bytes;
  {
    Tensor t = empty_on(DType::F32, Shape{1000}, kFake);
    EXPECT_EQ(alloc.stats().in_use_bytes, before + 4096);
  }
  EXPECT_EQ(alloc.stats().in_use_bytes, before);
  EXPECT_GE(alloc.stats().cached_bytes, 4096);
}

TEST_F(DeviceTensor, HostAccessToADeviceTensorIsAnErrorNamingIt) {
  Tensor t = to_device(random_host(Shape{3, 5}, 1), kFake);
  const std::string name = "device tensor (f32 " + Shape{3, 5}.to_string() + " on cuda:7)";
  auto expect_guarded = [&](auto&& access, const char* through) {
    try {
      access();
      ADD_FAILURE() << "host access through " << through << " was not caught";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(through), std::string::npos) << e.what();
    }
  };
  expect_guarded([&] { (void)t.raw(); }, "raw()");
  expect_guarded([&] { (void)t.data<float>(); }, "data()");
  expect_guarded([&] { (void)t.storage(); }, "storage()");
  expect_guarded([&] { (void)t.at(0); }, "data()");
  expect_guarded([&] { (void)t.clone(); }, "raw()");
  EXPECT_NE(std::string(t.to_string()).find("on cuda:7"), std::string::npos) << t.to_string();
}

TEST_F(DeviceTensor, DereferencingDeviceMemoryOnTheHostDies) {
  Tensor t = to_device(random_host(Shape{8}, 2), kFake);
  const volatile float* p = static_cast<const float*>(t.device_ptr());
  EXPECT_DEATH({ [[maybe_unused]] float x = *p; }, "");
}

TEST_F(DeviceTensor, BadRequestsAreClearErrors) {
  const Tensor host = random_host(Shape{2}, 4);
  EXPECT_THROW((void)host.device_ptr(), Error);
  EXPECT_THROW(to_host(host), Error);
  const Tensor dev = to_device(host, kFake);
  EXPECT_THROW(to_device(dev, kFake), Error);
  try {
    to_device(host, Device::cuda(42));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device memory for cuda:42"), std::string::npos) << e.what();
  }
}

// The access windows the fake device's kernels run in: nested opens of one block keep it open until
// the last close, and it is PROT_NONE again after.
TEST_F(DeviceTensor, HostWindowsNestAndCloseAfterTheLast) {
  const Tensor host = random_host(Shape{16}, 5);
  const Tensor dev = to_device(host, kFake);
  const float* p = static_cast<const float*>(dev.device_ptr());
  EXPECT_TRUE(fake_->owns(p + 3));
  EXPECT_FALSE(fake_->owns(host.data<float>()));
  fake_->open_for_host(p, dev.nbytes());
  fake_->open_for_host(p + 4, 4 * sizeof(float));
  fake_->close_for_host(p + 4);
  EXPECT_EQ(p[5], host.data<float>()[5]);  // still open: one window left
  fake_->close_for_host(p);
  const volatile float* q = p;
  EXPECT_DEATH({ [[maybe_unused]] float x = q[5]; }, "");
  EXPECT_THROW(fake_->open_for_host(host.data<float>(), 4), Error);  // not device memory
}

// Streams and events as the runtime uses them, in the fake device's log.
TEST_F(DeviceTensor, StreamsAndEventsAreLogged) {
  fake_->clear_stream_log();
  const Stream a = fake_->create_stream(), b = fake_->create_stream();
  EXPECT_NE(a, b);
  EXPECT_NE(a.handle, nullptr);
  const uint64_t e = fake_->record_event(a);
  fake_->wait_event(b, e);
  fake_->release_event(e);
  EXPECT_THROW(fake_->wait_event(b, e), Error);  // released
  fake_->note_launch(b);
  (void)to_host(to_device(random_host(Shape{2}, 6), kFake, b), b);
  using K = FakeDeviceMemory::StreamEvent::Kind;
  const std::vector<FakeDeviceMemory::StreamEvent> log = fake_->stream_log();
  const std::vector<K> kinds = {K::Record, K::Wait, K::Launch, K::CopyToDevice, K::Synchronize, K::CopyToHost,
                                K::Synchronize};
  ASSERT_EQ(log.size(), kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) EXPECT_EQ(log[i].kind, kinds[i]) << i;
  EXPECT_EQ(log[0].stream, a.handle);
  EXPECT_EQ(log[1].stream, b.handle);
  EXPECT_EQ(log[1].event, log[0].event);
  fake_->destroy_stream(a);
  fake_->destroy_stream(b);
}

}  // namespace
}  // namespace shardwise
