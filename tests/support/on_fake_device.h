#pragma once
// A test fixture with a fake device (tensor/fake_device.h) registered as cuda:0 and its kernel
// table (ops/fake_device_kernels.h) installed for DeviceKind::Cuda; the table before it comes back
// after the test.
#include <gtest/gtest.h>

#include <memory>

#include "shardwise/ops/device_kernels.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/stream_races.h"

namespace shardwise {

class OnFakeDevice : public testing::Test {
 protected:
  static constexpr Device kFake{DeviceKind::Cuda, 0};  // cuda:0
  void SetUp() override {
    fake_ = &register_fake_device({.index = 0});
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  }
  void TearDown() override {
    ops::install_device_kernels(DeviceKind::Cuda, previous_);
    expect_no_stream_races(*fake_);
  }

 private:
  FakeDeviceMemory* fake_ = nullptr;
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
};

}  // namespace shardwise
