#pragma once
// Shared by the CUDA tests: skip with the reason where no GPU is present (every machine `make test`
// runs on), register the GPUs once, random f32 inputs, and a comparison naming what differs.
#include <gtest/gtest.h>

#include <cstring>

#include <random>
#include <string>
#include <vector>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda_test {

inline const Device kGpu = Device::cuda(0);

class Gpu : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU on this machine (" << why << ")";
    static const int registered = cuda::register_devices();
    ASSERT_GT(registered, 0);
  }
};

inline Tensor random_f32(const Shape& shape, unsigned seed, float lo = -3.f, float hi = 3.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = dist(gen);
  return Tensor::from<float>(shape, v);
}

inline void expect_close(const Tensor& device_result, const Tensor& cpu, double rtol, double atol,
                         const std::string& what) {
  const CompareResult r = compare(to_host(device_result), cpu, rtol, atol);
  EXPECT_TRUE(r.equal) << what << ": " << r.message;
}

inline bool bit_equal(const Tensor& a, const Tensor& b) {
  const Tensor ha = to_host(a), hb = to_host(b);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

}  // namespace shardwise::cuda_test
