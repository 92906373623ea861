// Broadcasting helpers against hand-computed shapes and sums, and a naive div/mod index reference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise {
namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Broadcast, ShapesAlignRight) {
  EXPECT_EQ(broadcast_shapes({12, 6}, {6}), (Shape{12, 6}));
  EXPECT_EQ(broadcast_shapes({6}, {12, 6}), (Shape{12, 6}));
  EXPECT_EQ(broadcast_shapes({5, 1}, {1, 7}), (Shape{5, 7}));
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes(Shape{}, {3, 4}), (Shape{3, 4}));
  EXPECT_EQ(broadcast_shapes(Shape{}, Shape{}), Shape{});
  EXPECT_EQ(broadcast_shapes({1, 1}, {1}), (Shape{1, 1}));
  // A size-0 dim broadcasts like any other extent: against 1 it stays 0.
  EXPECT_EQ(broadcast_shapes({0, 3}, {1, 3}), (Shape{0, 3}));
  EXPECT_EQ(broadcast_shapes({5, 1}, {7}, {2, 1, 1}), (Shape{2, 5, 7}));
}

TEST(Broadcast, MismatchNamesBothShapes) {
  std::string msg = error_of([] { broadcast_shapes({3, 4}, {5}); });
  EXPECT_NE(msg.find("3x4"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" 5 "), std::string::npos) << msg;
  EXPECT_NE(msg.find("do not broadcast"), std::string::npos) << msg;
  EXPECT_THROW(broadcast_shapes({2, 3}, {3, 3}), Error);
  EXPECT_THROW(broadcast_shapes({0}, {2}), Error);
  msg = error_of([] { broadcast_shapes({5, 7}, {7}, {4, 1}); });
  EXPECT_NE(msg.find("5x7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4x1"), std::string::npos) << msg;
}

TEST(Broadcast, BroadcastsTo) {
  EXPECT_TRUE(broadcasts_to({6}, {12, 6}));
  EXPECT_TRUE(broadcasts_to({1, 7}, {5, 7}));
  EXPECT_TRUE(broadcasts_to(Shape{}, {5, 7}));
  EXPECT_FALSE(broadcasts_to({5, 7}, {7}));   // higher rank
  EXPECT_FALSE(broadcasts_to({5, 1}, {1, 7}));  // 5 cannot shrink to 1
  EXPECT_FALSE(broadcasts_to({3}, {5, 7}));
}

TEST(Broadcast, Strides) {
  auto s = broadcast_strides({5, 1}, {5, 7});
  EXPECT_EQ(s[0], 1);
  EXPECT_EQ(s[1], 0);
  s = broadcast_strides({7}, {5, 7});
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(s[1], 1);
  s = broadcast_strides({3, 1, 4}, {2, 3, 5, 4});
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(s[1], 4);
  EXPECT_EQ(s[2], 0);
  EXPECT_EQ(s[3], 1);
  EXPECT_THROW(broadcast_strides({3}, {5, 7}), Error);
}

// Flat index into a contiguous `in` of the element at output multi-index `idx`: computed the slow
// way, independently of the odometer walk.
int64_t naive_offset(const Shape& in, const Shape& out, int64_t flat) {
  std::vector<int64_t> idx(out.size());
  for (int d = out.ndim() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = flat % out[d];
    flat /= out[d];
  }
  int64_t off = 0;
  const int lead = out.ndim() - in.ndim();
  for (int d = 0; d < in.ndim(); ++d) {
    int64_t i = in[d] == 1 ? 0 : idx[static_cast<size_t>(d + lead)];
    off = off * in[d] + i;
  }
  return off;
}

TEST(Broadcast, ForEachMatchesNaiveIndexing) {
  struct Case {
    Shape a, b, c;
  };
  for (const Case& k : {Case{{2, 3, 4}, {3, 1}, {4}}, Case{{5, 1}, {1, 7}, {1}}, Case{{1}, {2, 1, 3}, {2, 4, 1}},
                        Case{{6}, {6}, {6}}}) {
    Shape out = broadcast_shapes(k.a, k.b, k.c);
    int64_t calls = 0;
    bool ok = true;
    broadcast_for_each<3>(out, {k.a, k.b, k.c}, [&](int64_t i, const std::array<int64_t, 3>& o) {
      ok = ok && i == calls && o[0] == naive_offset(k.a, out, i) && o[1] == naive_offset(k.b, out, i) &&
           o[2] == naive_offset(k.c, out, i);
      ++calls;
    });
    EXPECT_TRUE(ok) << out.to_string();
    EXPECT_EQ(calls, out.numel());
  }
}

TEST(Broadcast, ForEachEmptyAndScalar) {
  int calls = 0;
  broadcast_for_each<2>(Shape{0, 3}, {Shape{0, 3}, Shape{3}}, [&](int64_t, const auto&) { ++calls; });
  broadcast_for_each<2>(Shape{4, 0}, {Shape{4, 1}, Shape{0}}, [&](int64_t, const auto&) { ++calls; });
  EXPECT_EQ(calls, 0);
  broadcast_for_each<2>(Shape{}, {Shape{}, Shape{}}, [&](int64_t i, const std::array<int64_t, 2>& o) {
    EXPECT_EQ(i, 0);
    EXPECT_EQ(o[0], 0);
    EXPECT_EQ(o[1], 0);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.at(i));
  return v;
}

TEST(Broadcast, ReduceToShapeHandValues) {
  // [[1, 2, 3], [4, 5, 6]]
  Tensor g = Tensor::from<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor r = reduce_to_shape(g, {3});
  EXPECT_EQ(r.shape(), Shape{3});
  EXPECT_EQ(values_of(r), (std::vector<double>{5, 7, 9}));
  r = reduce_to_shape(g, {1, 3});
  EXPECT_EQ(r.shape(), (Shape{1, 3}));
  EXPECT_EQ(values_of(r), (std::vector<double>{5, 7, 9}));
  r = reduce_to_shape(g, {2, 1});
  EXPECT_EQ(values_of(r), (std::vector<double>{6, 15}));
  r = reduce_to_shape(g, {1, 1});
  EXPECT_EQ(values_of(r), (std::vector<double>{21}));
  r = reduce_to_shape(g, Shape{});
  EXPECT_EQ(r.ndim(), 0);
  EXPECT_EQ(values_of(r), (std::vector<double>{21}));
  // Same shape: the gradient itself.
  EXPECT_EQ(reduce_to_shape(g, {2, 3}).raw(), g.raw());
}

TEST(Broadcast, ReduceToShape3dAndIntegers) {
  // g[i][j][k] = 100 i + 10 j + k on 2x3x2; reduced to 3x1: sum over i and k.
  std::vector<int64_t> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) v.push_back(100 * i + 10 * j + k);
  Tensor g = Tensor::from<int64_t>({2, 3, 2}, v);
  Tensor r = reduce_to_shape(g, {3, 1});
  EXPECT_EQ(r.dtype(), DType::I64);
  // j: sum over i in {0,1}, k in {0,1} of (100 i + 10 j + k) = 200 + 40 j + 2.
  EXPECT_EQ(values_of(r), (std::vector<double>{202, 242, 282}));
}

// Every element of the gradient added into its target in row-major order in double, through the
// element walk: the sums reduce_to_shape must reproduce bit for bit (its bias-gradient fast path
// keeps that order).
Tensor naive_reduce_f32(const Tensor& g, const Shape& shape) {
  std::vector<double> acc(static_cast<size_t>(shape.numel()), 0.0);
  const float* p = g.data<float>();
  broadcast_for_each<2>(g.shape(), {g.shape(), shape}, [&](int64_t, const std::array<int64_t, 2>& o) {
    acc[static_cast<size_t>(o[1])] += static_cast<double>(p[o[0]]);
  });
  std::vector<float> out(acc.begin(), acc.end());
  return Tensor::from<float>(shape, out);
}

TEST(Broadcast, ReduceToShapeColumnSumsEqualTheElementWalk) {
  const Shape g_shape{3, 4, 5};
  std::vector<float> v;
  for (int64_t i = 0; i < g_shape.numel(); ++i) v.push_back(static_cast<float>(std::sin(0.7 * static_cast<double>(i)) * 1e3));
  Tensor g = Tensor::from<float>(g_shape, v);
  for (const Shape& s : {Shape{5}, Shape{4, 5}, Shape{1, 4, 5}, Shape{1, 1, 5}, Shape{1}, Shape{}, Shape{3, 1, 5},
                         Shape{4, 1}, Shape{1, 4, 1}}) {
    Tensor got = reduce_to_shape(g, s), want = naive_reduce_f32(g, s);
    ASSERT_EQ(got.shape(), s);
    EXPECT_EQ(values_of(got), values_of(want)) << s.to_string();
  }
  // A column-sum reduction with extent-1 dims kept in the middle.
  Tensor h = Tensor::from<float>({2, 1, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values_of(reduce_to_shape(h, {1, 1, 3})), (std::vector<double>{5, 7, 9}));
}

TEST(Broadcast, ReduceToShapeEmptyAndErrors) {
  Tensor empty(DType::F32, {0, 3});
  Tensor r = reduce_to_shape(empty, {3});
  EXPECT_EQ(values_of(r), (std::vector<double>{0, 0, 0}));
  Tensor g = Tensor::from<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  std::string msg = error_of([&] { reduce_to_shape(g, {4}); });
  EXPECT_NE(msg.find("2x3"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" 4 "), std::string::npos) << msg;
  EXPECT_THROW(reduce_to_shape(g, {2, 2, 3}), Error);
}

}  // namespace
}  // namespace shardwise
