// The walks the elementwise and layout kernels index by (cuda/walk.h): for every element of a
// broadcast, the operands' offsets a walk gives (decomposed here as the kernels do, walk.cuh) equal
// tensor/broadcast.h's; dims of extent 1 drop out and dims every operand steps over as one merge.
// Host code only: runs on every machine the CUDA layer builds on, GPU or not.
#include <gtest/gtest.h>

#include <array>

#include "shardwise/cuda/common/walk.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise::cuda_test {
namespace {

std::array<int64_t, 3> offsets(const cuda::launch::Walk& w, int64_t i) {
  std::array<int64_t, 3> o{w.offset[0], w.offset[1], w.offset[2]};
  for (int d = w.ndim - 1; d >= 0; --d) {
    const int64_t idx = i % w.shape[d];
    i /= w.shape[d];
    for (size_t k = 0; k < 3; ++k) o[k] += idx * w.stride[k][d];
  }
  return o;
}

TEST(CudaWalk, OffsetsEqualTheBroadcastWalk) {
  const std::pair<Shape, Shape> cases[] = {{Shape{7}, Shape{7}},         {Shape{3, 1, 5}, Shape{4, 5}},
                                           {Shape{2, 3, 17}, Shape{17}}, {Shape{33, 1}, Shape{1, 1025}},
                                           {Shape{1}, Shape{9}},         {Shape{2, 1, 3, 1, 2}, Shape{5, 1, 4, 2}},
                                           {Shape{}, Shape{3, 2}}};
  for (const auto& [xs, ys] : cases) {
    const Shape out = broadcast_shapes(xs, ys);
    const cuda::launch::Walk w = cuda::detail::make_walk(
        out, {broadcast_strides(xs, out), broadcast_strides(ys, out), contiguous_strides(out)});
    ASSERT_EQ(w.numel(), out.numel()) << xs.to_string() << " " << ys.to_string();
    broadcast_for_each<2>(out, {xs, ys}, [&](int64_t i, const std::array<int64_t, 2>& want) {
      const std::array<int64_t, 3> got = offsets(w, i);
      EXPECT_EQ(got[0], want[0]) << xs.to_string() << " " << ys.to_string() << " element " << i;
      EXPECT_EQ(got[1], want[1]) << xs.to_string() << " " << ys.to_string() << " element " << i;
      EXPECT_EQ(got[2], i);
    });
  }
}

TEST(CudaWalk, ContiguousRunsMergeIntoOneDim) {
  const Shape out{2, 3, 17};
  const cuda::launch::Walk same = cuda::detail::make_walk(out, {contiguous_strides(out), contiguous_strides(out)});
  EXPECT_EQ(same.ndim, 1);
  EXPECT_EQ(same.shape[0], 102);
  const cuda::launch::Walk bias = cuda::detail::make_walk(out, {contiguous_strides(out), broadcast_strides(Shape{17}, out)});
  EXPECT_EQ(bias.ndim, 2);  // [6, 17]: the bias repeats every row
  EXPECT_EQ(bias.shape[0], 6);
  const cuda::launch::Walk empty = cuda::detail::make_walk(Shape{3, 0}, {contiguous_strides(Shape{3, 0})});
  EXPECT_EQ(empty.numel(), 0);
}

}  // namespace
}  // namespace shardwise::cuda_test
