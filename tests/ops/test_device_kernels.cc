// Ops on device tensors (ops/device_kernels.h): an op whose inputs are on a device runs that device
// kind's kernel, or fails naming the op and the device (never a silent host round trip); the fake
// device's table (ops/fake_device_kernels.h) runs the CPU kernels on fake-device memory and gives
// the CPU's results bit for bit with no counted host-device copy.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>

#include "shardwise/core/error.h"
#include "shardwise/ops/device_kernels.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/error_of.h"

namespace shardwise::ops {
namespace {

const Device kFake = Device::cuda(0);

Tensor random_f32(const Shape& shape, unsigned seed) {
  Tensor t(DType::F32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

class DeviceKernels : public testing::Test {
 protected:
  void SetUp() override {
    register_fake_device({.index = 0});
    previous_ = install_device_kernels(DeviceKind::Cuda, nullptr);
  }
  void TearDown() override { install_device_kernels(DeviceKind::Cuda, previous_); }
  std::shared_ptr<const DeviceKernelTable> previous_;
};

TEST_F(DeviceKernels, NoTableForTheDeviceNamesTheOpAndTheDevice) {
  const Tensor x = to_device(random_f32(Shape{3, 4}, 1), kFake);
  const std::string e = error_of([&] { run_forward(op_registry().get("add"), std::vector<Tensor>{x, x}, {}); });
  EXPECT_NE(e.find("op 'add'"), std::string::npos) << e;
  EXPECT_NE(e.find("cuda:0"), std::string::npos) << e;
}

TEST_F(DeviceKernels, AnOpWithoutAKernelInTheTableIsAnErrorNotAHostRoundTrip) {
  auto table = std::make_shared<DeviceKernelTable>("cuda");
  table->add_forward("gelu", [](const OpDef&, std::span<const Tensor> in, const Attrs&, const KernelContext*) {
    return std::vector<Tensor>{in[0]};
  });
  install_device_kernels(DeviceKind::Cuda, table);
  reset_device_copy_stats();
  const Tensor x = to_device(random_f32(Shape{3, 4}, 1), kFake);
  const std::string e = error_of([&] { run_forward(op_registry().get("add"), std::vector<Tensor>{x, x}, {}); });
  EXPECT_NE(e.find("op 'add' has no cuda kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("cuda:0"), std::string::npos) << e;
  EXPECT_NE(e.find("gelu"), std::string::npos) << e;  // the ops that have one
  const Tensor dy = x;
  const std::string b = error_of([&] {
    run_backward(op_registry().get("gelu"), std::vector<Tensor>{x}, std::vector<Tensor>{x}, std::vector<Tensor>{dy}, {});
  });
  EXPECT_NE(b.find("op 'gelu' has no cuda gradient kernel"), std::string::npos) << b;
  EXPECT_EQ(device_copy_stats().to_host_copies, 0);
  // The table's own kernel runs: here the identity it was given.
  std::vector<Tensor> out = run_forward(op_registry().get("gelu"), std::vector<Tensor>{x}, {});
  EXPECT_EQ(out[0].device_ptr(), x.device_ptr());
}

TEST_F(DeviceKernels, MixedHostAndDeviceInputsNameTheInput) {
  install_device_kernels(DeviceKind::Cuda, fake_device_kernels());
  const Tensor host = random_f32(Shape{3, 4}, 1);
  const Tensor dev = to_device(host, kFake);
  const std::string e = error_of([&] { run_forward(op_registry().get("add"), std::vector<Tensor>{dev, host}, {}); });
  EXPECT_NE(e.find("op 'add': input 1 is on host but the others are on cuda:0"), std::string::npos) << e;
}

TEST_F(DeviceKernels, FakeTableGivesTheCpuResultsWithoutCountedCopies) {
  install_device_kernels(DeviceKind::Cuda, fake_device_kernels());
  const Tensor x = random_f32(Shape{5, 7}, 2), scale = random_f32(Shape{7}, 3), bias = random_f32(Shape{7}, 4);
  const Tensor dy = random_f32(Shape{5, 7}, 5);
  const OpDef& ln = op_registry().get("layer_norm");
  const std::vector<Tensor> host_in{x, scale, bias};
  const std::vector<Tensor> want = run_forward(ln, host_in, {});
  const std::vector<Tensor> want_grad = run_backward(ln, host_in, want, std::vector<Tensor>{dy, Tensor(), Tensor()}, {});

  std::vector<Tensor> dev_in{to_device(x, kFake), to_device(scale, kFake), to_device(bias, kFake)};
  const Tensor ddy = to_device(dy, kFake);
  reset_device_copy_stats();
  const std::vector<Tensor> got = run_forward(ln, dev_in, {});
  const std::vector<Tensor> got_grad = run_backward(ln, dev_in, got, std::vector<Tensor>{ddy, Tensor(), Tensor()}, {});
  const DeviceCopyStats s = device_copy_stats();
  EXPECT_EQ(s.to_host_copies, 0);
  EXPECT_EQ(s.to_device_copies, 0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_TRUE(got[k].on_device()) << k;
    EXPECT_TRUE(compare(to_host(got[k]), want[k]).equal) << k;
  }
  for (size_t k = 0; k < got_grad.size(); ++k) {
    ASSERT_TRUE(got_grad[k].on_device()) << k;
    EXPECT_TRUE(compare(to_host(got_grad[k]), want_grad[k]).equal) << k;
  }
}

TEST_F(DeviceKernels, FakeTableKeepsAReshapeOnTheInputsMemory) {
  install_device_kernels(DeviceKind::Cuda, fake_device_kernels());
  const Tensor x = to_device(random_f32(Shape{3, 4}, 1), kFake);
  const Attrs a{{"shape", std::vector<int64_t>{4, 3}}};
  const std::vector<Tensor> out = run_forward(op_registry().get("reshape"), std::vector<Tensor>{x}, a);
  ASSERT_TRUE(out[0].on_device());
  EXPECT_EQ(out[0].shape(), (Shape{4, 3}));
  EXPECT_EQ(out[0].device_ptr(), x.device_ptr());  // a view of the input, not a copy
  EXPECT_TRUE(compare(to_host(out[0]).reshaped(Shape{3, 4}), to_host(x)).equal);
}

TEST_F(DeviceKernels, FillOnTheFakeDevice) {
  EXPECT_NE(error_of([] { fill_on_device(DType::F32, Shape{2}, 1.0, kFake); }).find("no fill kernel for cuda:0"),
            std::string::npos);
  install_device_kernels(DeviceKind::Cuda, fake_device_kernels());
  const Tensor t = fill_on_device(DType::F32, Shape{2, 3}, 1.5, kFake);
  ASSERT_TRUE(t.on_device());
  EXPECT_TRUE(compare(to_host(t), Tensor::full(DType::F32, Shape{2, 3}, 1.5)).equal);
}

}  // namespace
}  // namespace shardwise::ops
