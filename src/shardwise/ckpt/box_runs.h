#pragma once
// Contiguous runs of a box (global coordinates) inside two row-major regions that contain it: a
// whole tensor stored in a file and a rank's local block, or the other way round. Every byte a
// checkpoint moves goes through here, one memcpy/pwrite per run.
#include <array>
#include <cstdint>
#include <span>

#include "shardwise/core/shape.h"
#include "shardwise/reshard/blocks.h"

namespace shardwise::ckpt {

// A region of a global tensor stored row-major: its shape and its global origin.
struct Region {
  Shape shape;
  std::array<int64_t, kMaxDims> origin{};
  static Region whole(const Shape& global) { return {global, {}}; }
  static Region of(const reshard::Box& box) { return {box.shape, box.offset}; }
};

// Calls fn(src_element_offset, dst_element_offset, element_count) for every maximal run of `box`
// contiguous in both `src` and `dst` (both must contain the box). Nothing for an empty box; one
// run of one element for a scalar.
template <class Fn>
void for_each_run(const reshard::Box& box, const Region& src, const Region& dst, Fn&& fn) {
  const int n = box.shape.ndim();
  if (box.shape.numel() == 0) return;
  if (n == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  // Dims from `j` on are whole in the box, src and dst alike: one run covers them.
  int j = n - 1;
  while (j > 0 && box.shape[j] == src.shape[j] && box.shape[j] == dst.shape[j]) --j;
  int64_t run = 1;
  for (int d = j; d < n; ++d) run *= box.shape[d];
  std::array<int64_t, kMaxDims> src_stride = contiguous_strides(src.shape);
  std::array<int64_t, kMaxDims> dst_stride = contiguous_strides(dst.shape);
  std::array<int64_t, kMaxDims> idx{};
  while (true) {
    int64_t s = 0, t = 0;
    for (int d = 0; d < n; ++d) {
      auto i = static_cast<size_t>(d);
      int64_t g = box.offset[i] + (d < j ? idx[i] : 0);
      s += (g - src.origin[i]) * src_stride[i];
      t += (g - dst.origin[i]) * dst_stride[i];
    }
    fn(s, t, run);
    int d = j - 1;
    while (d >= 0) {
      auto i = static_cast<size_t>(d);
      if (++idx[i] < box.shape[d]) break;
      idx[i] = 0;
      --d;
    }
    if (d < 0) return;
  }
}

}  // namespace shardwise::ckpt
