#pragma once
// NumPy broadcasting: shape rules, a strided N-d walk over a broadcast result, and the reduction
// of a broadcast gradient back to an input's shape.
//
// Shapes are aligned to the right; two extents are compatible when equal or when one is 1 (it is
// repeated along that dim). A missing leading dim counts as 1.
#include <array>
#include <cstddef>
#include <cstdint>

#include "shardwise/core/shape.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise {

// The broadcast shape of the operands; Error naming every shape and the clashing dim otherwise.
Shape broadcast_shapes(const Shape& a, const Shape& b);
Shape broadcast_shapes(const Shape& a, const Shape& b, const Shape& c);

// True when `from` broadcasts to exactly `to` (every dim of `from` is 1 or equal, rank <= to's).
bool broadcasts_to(const Shape& from, const Shape& to);

// Element strides of a contiguous tensor of shape `in` read as shape `out` (right-aligned):
// 0 on broadcast dims (and on leading dims `in` lacks). `in` must broadcast to `out`.
std::array<int64_t, kMaxDims> broadcast_strides(const Shape& in, const Shape& out);

// Walks `out` one row (its last dim) at a time: fn(i, len, offsets, steps) for the row of `len`
// elements starting at flat index i of `out`, where the matching elements of a contiguous input of
// shape ins[k] (each must broadcast to `out`) are at offsets[k] + j * steps[k] for j < len
// (steps[k] is 1, or 0 when input k repeats one element along the row). The outer dims are walked
// like an odometer with per-input strides: no division per element. Lets a kernel pick a
// vectorizable loop per row. Only rows [row_begin, row_end) of the out.numel() / out[-1] rows
// (-1: to the last) are walked, so that threads can take disjoint ranges of rows.
template <size_t N, class Fn>
void broadcast_for_each_row(const Shape& out, const std::array<Shape, N>& ins, Fn&& fn, int64_t row_begin = 0,
                            int64_t row_end = -1) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int nd = out.ndim();
  std::array<int64_t, N> off{};
  if (nd == 0) {
    std::array<int64_t, N> steps{};
    if (row_begin == 0 && row_end != 0) fn(int64_t{0}, int64_t{1}, off, steps);
    return;
  }
  std::array<std::array<int64_t, kMaxDims>, N> strides;
  for (size_t k = 0; k < N; ++k) strides[k] = broadcast_strides(ins[k], out);
  const auto last = static_cast<size_t>(nd - 1);
  const int64_t inner = out[nd - 1];
  const int64_t rows = total / inner;
  if (row_end < 0 || row_end > rows) row_end = rows;
  std::array<int64_t, N> steps;
  for (size_t k = 0; k < N; ++k) steps[k] = strides[k][last];
  std::array<int64_t, kMaxDims> idx{};
  for (int64_t d = nd - 2, r = row_begin; d >= 0 && r > 0; --d) {  // the odometer at row_begin
    auto du = static_cast<size_t>(d);
    idx[du] = r % out[static_cast<int>(d)];
    r /= out[static_cast<int>(d)];
    for (size_t k = 0; k < N; ++k) off[k] += idx[du] * strides[k][du];
  }
  for (int64_t row = row_begin * inner; row < row_end * inner; row += inner) {
    fn(row, inner, off, steps);
    for (int d = nd - 2; d >= 0; --d) {
      auto du = static_cast<size_t>(d);
      for (size_t k = 0; k < N; ++k) off[k] += strides[k][du];
      if (++idx[du] < out[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][du] * out[d];
      idx[du] = 0;
    }
  }
}

// Calls fn(i, offsets) for every element i (row-major) of `out`, where offsets[k] is the flat index
// of the matching element of a contiguous input of shape ins[k] (each must broadcast to `out`).
template <size_t N, class Fn>
void broadcast_for_each(const Shape& out, const std::array<Shape, N>& ins, Fn&& fn) {
  broadcast_for_each_row<N>(out, ins, [&](int64_t i, int64_t len, std::array<int64_t, N> off,
                                          const std::array<int64_t, N>& steps) {
    for (int64_t j = 0; j < len; ++j) {
      fn(i + j, off);
      for (size_t k = 0; k < N; ++k) off[k] += steps[k];
    }
  });
}

// Sums `grad` (of a broadcast result's shape) over the dims along which an operand of `shape` was
// broadcast, giving a tensor of `shape` and grad's dtype: the gradient of that operand. Floats
// accumulate in double. Returns `grad` itself when the shapes are equal. Error unless `shape`
// broadcasts to grad's shape.
Tensor reduce_to_shape(const Tensor& grad, const Shape& shape);

}  // namespace shardwise
