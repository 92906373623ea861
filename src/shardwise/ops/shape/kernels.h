#pragma once
// Reference CPU kernels of the shape ops (PaddlePaddle / NumPy semantics): reshape, transpose,
// squeeze, unsqueeze, flatten, expand, concat, split, slice, stack, tile — forward and backward —
// plus the shape arithmetic their SPMD rules share.
//
// Attributes (errors name the op, the shapes and what is allowed):
//  reshape    shape=[...]      at most one -1 (inferred); 0 is an extent like any other
//  transpose  perm=[...]       a permutation of the dims (negative entries count from the end)
//  squeeze    axis=[...]       dims to drop, each of extent 1 (absent/empty: every extent-1 dim)
//  unsqueeze  axis=[...]       positions of the new extent-1 dims in the OUTPUT
//  flatten    start_axis=0, stop_axis=-1
//  expand     shape=[...]      NumPy broadcast target (right-aligned); -1 keeps x's extent
//  concat     axis=0           variadic; extents equal except along axis
//  split      axis=0 and sections=[sizes] (one -1 allowed) or num=k (equal parts)
//  slice      axes, starts, ends: Python bounds (negative counts from the end, clamped); step 1
//  stack      axis=0           variadic; equal shapes; the new dim sits at axis of the output
//  tile       repeat_times=[...] (NumPy: shorter lists are padded with leading 1s, longer ones
//             give x leading extent-1 dims)
//
// Kernels that run on shards: reshape, squeeze, unsqueeze, flatten and expand take the GLOBAL
// input shape (the verifier and the runtime pass it in the KernelContext) and infer the local
// output shape from the local input (see local_reshape_shape): attributes hold global extents.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// ---- reading int-list attributes without allocating (rules call these) ----
// The int list `name` (a single int counts as a one-element list, stored in `scratch`); empty
// when absent. Error naming `op` when the attribute holds something else.
std::span<const int64_t> attr_ints(const Attrs& attrs, std::string_view name, int64_t& scratch, std::string_view op);

// ---- reshape family: the dimension transform ----
// A reshape maps GROUPS of consecutive input dims to groups of consecutive output dims with the same
// element count. Built left to right: equal extents pair 1:1; an unpaired extent-1 dim forms its
// own group (an input dim that disappears or an output dim that appears); otherwise input and
// output dims are taken until both products agree (a flatten, a split, or a general regroup). A
// tensor with no elements is one group.
struct DimGroup {
  int8_t in_begin = 0, in_end = 0, out_begin = 0, out_end = 0;
  int in_count() const { return in_end - in_begin; }
  int out_count() const { return out_end - out_begin; }
  bool one_to_one() const { return in_count() == 1 && out_count() == 1; }
};
struct DimTransform {
  std::array<DimGroup, 2 * kMaxDims> groups{};
  int count = 0;
  std::span<const DimGroup> view() const { return {groups.data(), static_cast<size_t>(count)}; }
};
DimTransform reshape_transform(const Shape& in, const Shape& out);

// The local output shape when a shard of global shape `global_in` (local shape `local_in`) is
// reshaped to `global_out`: per group, the leftmost output dim takes the local element count
// divided by the other output extents, or, for less than one of them, the contiguous range
// [1, .., 1, k, n, .., n]. Error when the shard is not a block that reshapes to a block (a dim of
// a group sharded after one that is neither single entries nor whole, a removed extent-1 dim
// sharded, a count that does not divide): the SPMD rule must have required Replicate there.
Shape local_reshape_shape(const Shape& global_in, const Shape& global_out, const Shape& local_in, std::string_view op);
// `x` (a shard of `global_in`) reshaped to its part of `global_out`: a view sharing x's storage.
Tensor reshape_local(const Tensor& x, const Shape& global_in, const Shape& global_out, std::string_view op);

// Output shapes (global) of the reshape family, from the input shape and the op's attributes.
Shape reshape_shape(const Shape& in, const Attrs& attrs);
Shape squeeze_shape(const Shape& in, const Attrs& attrs);
Shape unsqueeze_shape(const Shape& in, const Attrs& attrs);
Shape flatten_shape(const Shape& in, const Attrs& attrs);

// ---- transpose ----
struct Perm {
  std::array<int8_t, kMaxDims> to{};  // output dim j reads input dim to[j]
  int n = 0;
  Perm inverse() const;
};
Perm transpose_perm(const Shape& in, const Attrs& attrs);
Shape transpose_shape(const Shape& in, const Perm& perm);
Tensor transpose(const Tensor& x, const Perm& perm);

// ---- expand ----
// The broadcast target of expand for an input of `in` (global); -1 resolved.
Shape expand_shape(const Shape& in, const Attrs& attrs);
// True when x dim d (of `in`) is broadcast (extent 1 repeated) into `out`; false when it maps 1:1.
inline bool expand_broadcasts(const Shape& in, const Shape& out, int d) {
  return in[d] != out[d + out.ndim() - in.ndim()];
}
// The local expand of a shard `x` of `global_in` to the target `global_out`: dims that map 1:1 keep
// x's local extent, broadcast and new leading dims take the full target extent.
Tensor expand_local(const Tensor& x, const Shape& global_in, const Shape& global_out);
// dx of expand: dout (a shard of `global_out`) summed over the broadcast and leading dims into
// the local block of x (1:1 dims keep dout's local extent). Floats accumulate in double.
Tensor expand_backward_local(const Tensor& dout, const Shape& global_in, const Shape& global_out);

// ---- concat / split / stack ----
int concat_axis(const Attrs& attrs, int ndim, std::string_view op);  // attr "axis", default 0
// Error unless input `index` has first's rank and dtype and extents except along `axis`.
void check_concat_operand(const Shape& first, DType first_dtype, const Shape& other, DType dtype, int axis,
                          size_t index, std::string_view op);
Tensor concat(std::span<const Tensor> xs, int axis);
// Pieces of x along axis with the given extents (they must add up to x's extent).
std::vector<Tensor> split(const Tensor& x, int axis, std::span<const int64_t> sizes);

// split: the number of pieces (from sections or num; no allocation) and their extents.
int split_count(const Shape& in, const Attrs& attrs);
std::vector<int64_t> split_sizes(const Shape& in, const Attrs& attrs);

// stack: the new dim's position in the output (rank ndim + 1).
int stack_axis(const Attrs& attrs, int ndim);
Tensor stack(std::span<const Tensor> xs, int axis);
std::vector<Tensor> unstack(const Tensor& x, int axis);

// ---- slice ----
struct SliceBounds {
  std::array<int64_t, kMaxDims> start{}, size{};  // per dim of x: [start, start + size)
  uint32_t sliced = 0;                            // bit d: dim d is cut (its range is not the whole extent)
  Shape out;
};
SliceBounds slice_bounds(const Shape& in, const Attrs& attrs);
// The local slice of a shard x of `global_in`: cut dims must be whole (Replicate) on x.
Tensor slice_local(const Tensor& x, const Shape& global_in, const Attrs& attrs);
// dx of slice: zeros of x's local block (cut dims whole, others as dout's) with dout pasted in.
Tensor slice_backward_local(const Tensor& dout, const Shape& global_in, const Attrs& attrs);

// ---- tile ----
// repeat_times aligned with the output dims (rank max(x rank, list length)); `lead` = number
// of leading output dims x does not have.
struct TileSpec {
  std::array<int64_t, kMaxDims> reps{};
  int ndim = 0, lead = 0;
  Shape out;
};
TileSpec tile_spec(const Shape& in, const Attrs& attrs);
// Local tile of a shard x: dims with repeat != 1 must be whole on x; dims with repeat 1 keep
// x's local extent.
Tensor tile_local(const Tensor& x, const Shape& global_in, const Attrs& attrs);
// dx of tile: dout's tiles summed into x's local block (dims with repeat 1 keep dout's local extent,
// repeated dims of extent 1 and leading dims are summed over whatever dout holds locally, other
// repeated dims must be whole on dout).
Tensor tile_backward_local(const Tensor& dout, const Shape& global_in, const Attrs& attrs);

}  // namespace shardwise::ops
