#pragma once
// The 2-D copy check of a device's memory backend (DeviceMemory::copy_2d), shared by the fake
// device's test (tests/tensor) and CUDA's (tests/cuda): a [7, 13] f32 box at (2, 3) of an [11, 20]
// tensor out to a packed [7, 13] (source pitch 20, destination pitch 13) and back into a zeroed
// [11, 20]: exactly the box's elements move, each to its place.
#include <gtest/gtest.h>

#include <vector>

#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::test_support {

inline void check_box_copy(Device device) {
  std::vector<float> v(11 * 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor src = to_device(Tensor::from<float>(Shape{11, 20}, v), device);
  Tensor packed = empty_on(DType::F32, Shape{7, 13}, device);
  const size_t f = sizeof(float);
  DeviceMemory& m = device_memory(device);
  m.copy_2d(packed.device_ptr(), 13 * f, static_cast<const std::byte*>(src.device_ptr()) + (2 * 20 + 3) * f, 20 * f,
            13 * f, 7, {});
  const Tensor p = to_host(packed);
  for (int r = 0; r < 7; ++r) {
    for (int c = 0; c < 13; ++c) ASSERT_EQ(p.at(r * 13 + c), (r + 2) * 20 + (c + 3)) << r << "," << c;
  }
  Tensor back = zeros_on(DType::F32, Shape{11, 20}, device);
  m.copy_2d(static_cast<std::byte*>(back.device_ptr()) + (2 * 20 + 3) * f, 20 * f, packed.device_ptr(), 13 * f, 13 * f,
            7, {});
  const Tensor b = to_host(back);
  for (int r = 0; r < 11; ++r) {
    for (int c = 0; c < 20; ++c) {
      const bool inside = r >= 2 && r < 9 && c >= 3 && c < 16;
      ASSERT_EQ(b.at(r * 20 + c), inside ? r * 20 + c : 0.0) << r << "," << c;
    }
  }
}

}  // namespace shardwise::test_support
