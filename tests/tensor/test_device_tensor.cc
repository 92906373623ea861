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

}  // namespace
}  // namespace shardwise
