// The two calls collectives need from a device (tensor/device_memory.h), on the fake device: the
// reduction of device buffers gives, for every dtype and reduction, the values written out by hand
// (small integers: exact in every dtype) and the same bits as the host's reduce_buffers on random
// data (bf16 / f16 accumulate in float and round once, so three ranks differ from pairwise
// rounding); the 2-D copy moves exactly the rows asked, at both pitches, and nothing else. Both
// run inside the fake device's access windows: the memory is PROT_NONE again afterwards.
#include <gtest/gtest.h>

#include <cstring>

#include <random>
#include <vector>

#include "../support/box_copy_check.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/buffer_reduce.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"

namespace shardwise {
namespace {

const Device kFake = Device::cuda(6);

class DeviceReduce : public testing::Test {
 protected:
  void SetUp() override { fake_ = &register_fake_device({.index = 6}); }
  FakeDeviceMemory* fake_ = nullptr;
};

// Rank r's buffer: values (r + 1) * (i - 2) for i < 5 (so [-2, 2] times r + 1): exact in every dtype
// but bool (then i % 2 == r % 2).
Tensor small_values(DType dtype, int r) {
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) v.push_back(dtype == DType::Bool ? double((i + r) % 2) : (r + 1) * (i - 2.0));
  return Tensor::from<double>(Shape{5}, v).to(dtype);
}

double expected(BufferReduce op, DType dtype, int ranks, int i) {
  if (dtype == DType::Bool) {
    bool any = false, all = true;
    for (int r = 0; r < ranks; ++r) any = any || (i + r) % 2, all = all && (i + r) % 2;
    return op == BufferReduce::Prod || op == BufferReduce::Min ? all : any;
  }
  const double base = i - 2.0;
  double sum = 0, prod = 1, max = -1e9, min = 1e9;
  for (int r = 0; r < ranks; ++r) {
    const double v = (r + 1) * base;
    sum += v, prod *= v, max = std::max(max, v), min = std::min(min, v);
  }
  switch (op) {
    case BufferReduce::Sum: return sum;
    case BufferReduce::Avg: return is_floating(dtype) ? sum / ranks : std::trunc(sum / ranks);
    case BufferReduce::Max: return max;
    case BufferReduce::Min: return min;
    case BufferReduce::Prod: return prod;
  }
  return 0;
}

TEST_F(DeviceReduce, EveryDtypeAndOpGivesTheExactValues) {
  const int ranks = 3;
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8,
                      DType::U8, DType::Bool}) {
    for (BufferReduce op : {BufferReduce::Sum, BufferReduce::Avg, BufferReduce::Max, BufferReduce::Min,
                            BufferReduce::Prod}) {
      if (dtype == DType::U8) continue;  // (negative values; u8 below)
      std::vector<Tensor> in;
      std::vector<const void*> ptrs;
      for (int r = 0; r < ranks; ++r) {
        in.push_back(to_device(small_values(dtype, r), kFake));
        ptrs.push_back(in.back().device_ptr());
      }
      Tensor out = empty_on(dtype, Shape{5}, kFake);
      device_memory(kFake).reduce(ptrs, out.device_ptr(), 5, dtype, op, {});
      const Tensor got = to_host(out);
      for (int i = 0; i < 5; ++i) {
        EXPECT_EQ(got.at(i), expected(op, dtype, ranks, i)) << dtype_name(dtype) << " op " << int(op) << " at " << i;
      }
    }
  }
  // u8: 1 + 2 + 3 and 250 + 3 + 5 (wraps to 2, as the host's uint8 arithmetic does).
  const Tensor a = to_device(Tensor::from<double>(Shape{2}, {1, 250}).to(DType::U8), kFake),
               b = to_device(Tensor::from<double>(Shape{2}, {2, 3}).to(DType::U8), kFake),
               c = to_device(Tensor::from<double>(Shape{2}, {3, 5}).to(DType::U8), kFake);
  std::vector<const void*> ptrs{a.device_ptr(), b.device_ptr(), c.device_ptr()};
  Tensor out = empty_on(DType::U8, Shape{2}, kFake);
  device_memory(kFake).reduce(ptrs, out.device_ptr(), 2, DType::U8, BufferReduce::Sum, {});
  const Tensor got = to_host(out);
  EXPECT_EQ(got.at(0), 6);
  EXPECT_EQ(got.at(1), 2);
}

TEST_F(DeviceReduce, RandomDataGivesTheHostReductionsBitsInPlaceToo) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> dist(-3, 3);
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    for (BufferReduce op : {BufferReduce::Sum, BufferReduce::Avg, BufferReduce::Max, BufferReduce::Min}) {
      const int64_t n = 1031;
      std::vector<Tensor> host, dev;
      std::vector<const void*> host_ptrs, dev_ptrs;
      for (int r = 0; r < 4; ++r) {
        std::vector<double> v(static_cast<size_t>(n));
        for (double& x : v) x = dist(gen);
        host.push_back(Tensor::from<double>(Shape{n}, v).to(dtype));
        dev.push_back(to_device(host.back(), kFake));
        host_ptrs.push_back(host.back().raw());
        dev_ptrs.push_back(dev.back().device_ptr());
      }
      Tensor want(dtype, Shape{n});
      reduce_buffers(host_ptrs, want.raw(), n, dtype, op);
      // In place: the result over the first input, as all_reduce(in == out) asks.
      device_memory(kFake).reduce(dev_ptrs, const_cast<void*>(dev_ptrs[0]), n, dtype, op, {});
      const Tensor got = to_host(dev[0]);
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << dtype_name(dtype) << " op " << int(op);
    }
  }
  // bf16 accumulates in float: 1 + 2^-8 + 2^-8 is 1 + 2^-7 (once rounded), not 1 (rounded twice).
  const Tensor one = to_device(Tensor::from<double>(Shape{1}, {1.0}).to(DType::BF16), kFake),
               tiny = to_device(Tensor::from<double>(Shape{1}, {1.0 / 256}).to(DType::BF16), kFake);
  std::vector<const void*> ptrs{one.device_ptr(), tiny.device_ptr(), tiny.device_ptr()};
  Tensor out = empty_on(DType::BF16, Shape{1}, kFake);
  device_memory(kFake).reduce(ptrs, out.device_ptr(), 1, DType::BF16, BufferReduce::Sum, {});
  EXPECT_EQ(to_host(out).at(0), 1.0 + 1.0 / 128);
}

TEST_F(DeviceReduce, TheMemoryIsClosedAgainAfterward) {
  const Tensor a = to_device(Tensor::from<float>(Shape{4}, {1, 2, 3, 4}), kFake);
  Tensor out = empty_on(DType::F32, Shape{4}, kFake);
  std::vector<const void*> ptrs{a.device_ptr(), a.device_ptr()};
  device_memory(kFake).reduce(ptrs, out.device_ptr(), 4, DType::F32, BufferReduce::Sum, {});
  EXPECT_DEATH((void)*static_cast<volatile const float*>(out.device_ptr()), "");
  EXPECT_EQ(to_host(out).at(3), 8.0);
}

TEST_F(DeviceReduce, ANonDeviceBufferIsAClearError) {
  float host[2] = {1, 2};
  Tensor out = empty_on(DType::F32, Shape{2}, kFake);
  std::vector<const void*> ptrs{host};
  EXPECT_THROW(
      {
        try {
          device_memory(kFake).reduce(ptrs, out.device_ptr(), 2, DType::F32, BufferReduce::Sum, {});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not device memory"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

TEST_F(DeviceReduce, TwoDCopiesMoveTheBoxAtBothPitches) {
  test_support::check_box_copy(kFake);
  DeviceMemory& m = device_memory(kFake);
  Tensor back = zeros_on(DType::F32, Shape{4}, kFake);
  const Tensor src = zeros_on(DType::F32, Shape{4}, kFake);
  m.copy_2d(back.device_ptr(), 0, src.device_ptr(), 0, 0, 0, {});  // nothing to move
  EXPECT_THROW(m.copy_2d(back.device_ptr(), 4, src.device_ptr(), 80, 8, 2, {}), Error);  // pitch below the row
}

}  // namespace
}  // namespace shardwise
