// The optimizer's kernels on device tensors (ops/train_kernels.h) through the fake device's table:
// AdamW (with the bf16 copy of the master), the sums of squares, scaling and the gradient sums give
// the CPU kernels' bits on fake-device memory, in place, without a counted copy; without a table, or
// on host tensors, each is an Error naming the kernel and the device.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "shardwise/ops/device_kernels.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/error_of.h"

namespace shardwise::ops {
namespace {

const Device kFake = Device::cuda(0);
constexpr int64_t kN = (1 << 16) + 4465;  // two blocks of the sums of squares, the last ragged

Tensor random_f32(int64_t n, unsigned seed, float lo = -2.f) {
  Tensor t(DType::F32, Shape{n});
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, 2.f);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = dist(gen);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class TrainKernels : public testing::Test {
 protected:
  void SetUp() override {
    register_fake_device({.index = 0});
    previous_ = install_device_kernels(DeviceKind::Cuda, fake_device_kernels());
  }
  void TearDown() override { install_device_kernels(DeviceKind::Cuda, previous_); }
  std::shared_ptr<const DeviceKernelTable> previous_;
};

TEST_F(TrainKernels, FakeDeviceGivesTheCpuBitsInPlace) {
  const AdamWHyper h{0.9, 0.95, 1e-8, 0.1, 3e-3, 3, true};
  Tensor w = random_f32(kN, 1), m = random_f32(kN, 2), v = random_f32(kN, 3, 0.f), g = random_f32(kN, 4);
  Tensor dw = to_device(w, kFake), dm = to_device(m, kFake), dv = to_device(v, kFake), dg = to_device(g, kFake);
  Tensor dp = to_device(w.to(DType::BF16), kFake);
  reset_device_copy_stats();
  const void* where = dw.device_ptr();
  adamw_on_device(dw, dm, dv, dg, h, &dp);
  adamw_update(w.data<float>(), m.data<float>(), v.data<float>(), g.data<float>(), kN, h);
  EXPECT_EQ(dw.device_ptr(), where);  // in place
  const Tensor scaled_host = [&] {
    Tensor t = g.clone();
    scale_in_place(t.data<float>(), kN, 0.37f);
    return t;
  }();
  scale_on_device(dg, 0.37f);
  const Tensor squares = squares_on_device(std::vector<Tensor>{dw, dg});
  Tensor sum;
  accumulate_on_device(sum, dp);  // bf16 in: an f32 copy, then f32 sums
  accumulate_on_device(sum, dg);
  EXPECT_EQ(device_copy_stats().to_host_copies + device_copy_stats().to_device_copies, 0);
  EXPECT_TRUE(same_bits(to_host(dw), w));
  EXPECT_TRUE(same_bits(to_host(dm), m));
  EXPECT_TRUE(same_bits(to_host(dv), v));
  EXPECT_TRUE(same_bits(to_host(dp), w.to(DType::BF16)));  // the updated master rounded
  EXPECT_TRUE(same_bits(to_host(dg), scaled_host));
  const Tensor sq = to_host(squares);
  ASSERT_EQ(sq.numel(), 2);
  EXPECT_EQ(sq.data<double>()[0], sum_of_squares(w.data<float>(), kN));
  EXPECT_EQ(sq.data<double>()[1], sum_of_squares(scaled_host.data<float>(), kN));
  Tensor expect = w.to(DType::BF16).to(DType::F32);
  for (int64_t i = 0; i < kN; ++i) expect.data<float>()[i] += scaled_host.data<float>()[i];
  EXPECT_TRUE(same_bits(to_host(sum), expect));
}

TEST_F(TrainKernels, WithoutATableOrOnTheHostEachIsAnErrorNamingIt) {
  Tensor g = random_f32(8, 5);
  EXPECT_NE(error_of([&] { scale_on_device(g, 2.f); }).find("scale: the tensors are on the host"), std::string::npos);
  Tensor d = to_device(g, kFake);
  install_device_kernels(DeviceKind::Cuda, nullptr);
  const std::string e = error_of([&] { scale_on_device(d, 2.f); });
  EXPECT_NE(e.find("scale on cuda:0: no such optimizer kernel is installed"), std::string::npos) << e;
  Tensor m = to_device(g, kFake), v = g;  // v on the host
  EXPECT_NE(error_of([&] { adamw_on_device(d, m, v, d, AdamWHyper{}); }).find("adamw: exp_avg_sq is host"),
            std::string::npos);
}

}  // namespace
}  // namespace shardwise::ops
