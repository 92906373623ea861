#pragma once
// Contiguous runs of a box (global coordinates) inside two row-major regions that contain it: a
// whole tensor stored in a file and a rank's local block, or the other way round. Every byte a
// checkpoint moves goes through here, one memcpy/pwrite per run.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

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

// Elements [begin, begin + count) of `block` seen flat, row-major, as boxes (global coordinates) in
// flat order: a head that ends a partial row, whole rows, a tail that starts one, recursively over
// the dims (at most 2 ndim - 1 boxes). Each box is contiguous in the block's row-major order, so it
// is also a row-major region of its own over the same elements. Nothing for an empty range; the
// one element of a scalar block as a scalar box.
inline std::vector<reshard::Box> flat_range_boxes(const reshard::Box& block, int64_t begin, int64_t count) {
  std::vector<reshard::Box> out;
  const int n = block.shape.ndim();
  if (count <= 0 || block.numel() == 0) return out;
  if (n == 0) {
    out.push_back(block);
    return out;
  }
  // [a, b): flat offsets within the sub-block of dims d.. whose index in the dims before d is fixed
  // by `at` (offsets of those dims, extent 1).
  auto cut = [&](auto&& self, reshard::Box at, int d, int64_t a, int64_t b) -> void {
    if (a >= b) return;
    auto i = static_cast<size_t>(d);
    if (d == n - 1) {
      at.offset[i] = block.offset[i] + a;
      at.shape[d] = b - a;
      out.push_back(at);
      return;
    }
    int64_t inner = 1;
    for (int e = d + 1; e < n; ++e) inner *= block.shape[e];
    int64_t first = a / inner;
    const int64_t last = b / inner;  // the row holding b's start
    auto row = [&](int64_t r) {
      reshard::Box one = at;
      one.offset[i] = block.offset[i] + r;
      one.shape[d] = 1;
      return one;
    };
    if (first == last) return self(self, row(first), d + 1, a % inner, b % inner);  // within one row
    if (a % inner != 0) self(self, row(first++), d + 1, a % inner, inner);          // head
    if (first < last) {                                                             // whole rows
      reshard::Box rows = at;
      rows.offset[i] = block.offset[i] + first;
      rows.shape[d] = last - first;
      out.push_back(rows);
    }
    if (b % inner != 0) self(self, row(last), d + 1, 0, b % inner);  // tail
  };
  reshard::Box whole = block;  // dims after d stay whole until cut
  cut(cut, whole, 0, begin, begin + count);
  return out;
}

}  // namespace shardwise::ckpt
