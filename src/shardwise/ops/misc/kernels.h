#pragma once
// Reference CPU kernels of dropout, cumsum, argmax / argmin and topk (forward and backward).
//
// dropout: keep element i iff Philox(seed, stream).uniform(g) >= p, where g is the GLOBAL
//   row-major index of the element in the whole (unsharded) tensor; out = x * mask / (1 - p).
//   Because the draw depends only on (seed, stream, g), a shard computed with its global offset
//   holds exactly the mask the whole tensor holds there, whatever the sharding. Floats only;
//   the mask is u8 (1 = kept). x * 0 keeps NaN/inf propagation (NaN * 0 = NaN, like PyTorch).
// cumsum: inclusive prefix sum along one axis; floats accumulate in double, integers wrap
//   (two's complement, never undefined behaviour); bool is rejected. Its gradient is the
//   reverse (suffix) cumsum of dy.
// argmax / argmin: int64 index along one axis; ties give the FIRST (lowest) index, like NumPy
//   and PyTorch; NaN counts as the extremum (the first NaN wins). An empty axis is an Error
//   unless the output is empty too.
// topk: the k largest (or smallest) values along an axis and their int64 indices. Order: by
//   value (descending for largest, ascending for smallest; NaN counts as larger than every
//   number), ties broken by the LOWER index first, so the result is deterministic. With
//   sorted = false the selected k come in increasing index order. Gradient: dvalues scattered
//   to the selected positions, zeros elsewhere.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// The "axis" attribute for a rank-`ndim` input, normalized to [0, ndim); `fallback` when the
// attribute is absent (none: it is required). Error naming `op` when out of range, not an int,
// or when the input is a scalar. Does not allocate on success (rules call it).
int misc_axis(const Attrs& attrs, int ndim, std::string_view op, std::optional<int64_t> fallback);

// ---- dropout ----
struct DropoutArgs {
  double p = 0.5;
  uint64_t seed = 0;
  uint64_t stream = 0;
  bool training = true;
};
// Reads p (float in [0, 1), default 0.5), seed (int, required), stream (int, default 0),
// training (bool, default true); Error for p outside [0, 1).
DropoutArgs dropout_args(const Attrs& attrs);
void check_dropout_dtype(DType dtype);  // floats only

// The keep mask (u8) of the local block of shape `local` at `offset` inside a tensor of
// `global_shape`. Error unless the block lies inside the global tensor.
Tensor dropout_mask(const Shape& local, const Shape& global_shape, std::span<const int64_t> offset,
                    const DropoutArgs& args);

struct DropoutResult {
  Tensor out;
  Tensor mask;
};
// x is the local block at `offset` of a tensor of `global_shape`. training = false: out = x
// (a copy), mask all ones.
DropoutResult dropout(const Tensor& x, const Shape& global_shape, std::span<const int64_t> offset,
                      const DropoutArgs& args);
DropoutResult dropout(const Tensor& x, const DropoutArgs& args);  // the whole tensor
// dx = dy * mask / (1 - p) (training), dy (not training).
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, const DropoutArgs& args);

// ---- cumsum ----
Tensor cumsum(const Tensor& x, int axis);
Tensor cumsum_backward(const Tensor& dy, int axis);  // the reverse (suffix) cumsum of dy
void check_cumsum_dtype(DType dtype);                // everything but bool

// ---- argmax / argmin ----
Shape arg_reduce_shape(const Shape& x, int axis, bool keepdim);
void check_arg_reduce_dtype(std::string_view op, DType dtype);  // everything but bool
Tensor argmax(const Tensor& x, int axis, bool keepdim);
Tensor argmin(const Tensor& x, int axis, bool keepdim);

// ---- topk ----
struct TopkArgs {
  int64_t k = 0;
  int axis = 0;
  bool largest = true;
  bool sorted = true;
};
// Reads k (int, required, 0 <= k <= extent of the axis), axis (default -1), largest (default
// true), sorted (default true) for an input of shape `x`. No allocation on success.
TopkArgs topk_args(const Attrs& attrs, const Shape& x);
void check_topk_dtype(DType dtype);  // everything but bool
struct TopkResult {
  Tensor values;
  Tensor indices;  // int64
};
TopkResult topk(const Tensor& x, const TopkArgs& args);
// dx of shape `x_shape` (dtype of dvalues): dvalues[.., j, ..] added at indices[.., j, ..].
Tensor topk_backward(const Shape& x_shape, const Tensor& dvalues, const Tensor& indices, int axis);

}  // namespace shardwise::ops
