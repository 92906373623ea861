#pragma once
// Inputs and comparisons the attention tests share: seeded uniform values, packed-document ids,
// a block of rows, elementwise closeness.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardwise/tensor/tensor.h"
#include "tests/ops/random_inputs.h"

namespace shardwise::ops::testing_attention {

// Values uniform in [-range, range) (random_inputs.h), in [-2, 2) unless told.
inline Tensor random_f64(const Shape& shape, uint64_t seed, double range = 2.0) {
  return testing::random_f64(shape, seed, range);
}

// Per-token document ids [B, S]: documents of lengths cycling through 1, 5, 2, 9, ... per row.
inline Tensor documents(int64_t B, int64_t S) {
  Tensor d(DType::I64, Shape{B, S});
  const int64_t lengths[] = {1, 5, 2, 9, 3, 17};
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0, left = lengths[b % 6];
    for (int64_t i = 0; i < S; ++i) {
      if (left == 0) left = lengths[(++doc + b) % 6];
      d.set_at(b * S + i, static_cast<double>(doc));
      --left;
    }
  }
  return d;
}

// Elements [x0, x0 + n) of dim `dim` of t.
inline Tensor rows(const Tensor& t, int dim, int64_t x0, int64_t n) {
  std::vector<int64_t> off(static_cast<size_t>(t.shape().ndim()), 0);
  off[static_cast<size_t>(dim)] = x0;
  Shape s = t.shape();
  s[dim] = n;
  return t.slice(off, s);
}

// Every element of got within tol of want's (a gtest failure naming `what` and the element).
inline void expect_near(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_NEAR(got.at(i), want.at(i), tol) << what << " element " << i;
}

}  // namespace shardwise::ops::testing_attention
