#pragma once
// Reference CPU kernels of the reductions: sum, mean, max, min, amax, amin, prod (forward and
// backward) over a set of axes, with or without keepdim.
//
// Attributes: axis (int or int list, negative allowed, duplicates are an Error; absent or empty =
// every dim), keepdim (bool, default false). The output dtype is the input dtype; mean needs a
// floating dtype; bool is rejected. Float sums and products accumulate in double; integer sums and
// products are exact modulo 2^bits (two's complement wrap, never undefined behaviour).
//
// An EMPTY reduced extent gives the identity of the reduction (sum 0, prod 1, max -inf / lowest
// integer, min +inf / highest integer), so that a rank holding an empty shard contributes nothing
// to a Partial reduction across ranks; mean over an empty extent is NaN (0 / 0).
//
// Gradients (PaddlePaddle's convention for ties):
//  - sum:  dx = dout broadcast;  mean: dx = dout / N, N = number of reduced elements of x.
//  - max / min: dout goes IN FULL to every position equal to the extremum (dx = dout * (x == out)).
//  - amax / amin: dout is split EVENLY among the tied positions (dx = dout * (x == out) / count);
//    integers use truncating division.
//  - prod: dx_i = dout * product of the OTHER elements of the slice (prefix * suffix products), so
//    zeros are exact: no division by x.
#include <cstdint>
#include <string_view>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

enum class ReduceKind : uint8_t { Sum, Mean, Max, Min, AMax, AMin, Prod };
std::string_view reduce_kind_name(ReduceKind kind);  // "sum", "mean", ...

// Bit d is set when dim d of a rank-`ndim` tensor is reduced. Reads attrs "axis" without
// allocating (rules call it); Error naming `op` for an out-of-range or duplicated axis.
uint32_t reduce_axes_mask(const Attrs& attrs, int ndim, std::string_view op);
inline bool reduce_keepdim(const Attrs& attrs) { return attrs.get_bool("keepdim", false); }

// The output shape: reduced dims removed, or kept with extent 1 when keepdim.
Shape reduce_output_shape(const Shape& input, uint32_t mask, bool keepdim);

// Error unless `kind` supports `dtype` (no bool; mean needs a floating dtype).
void check_reduce_dtype(ReduceKind kind, DType dtype);

Tensor reduce(ReduceKind kind, const Tensor& x, uint32_t mask, bool keepdim);
Tensor reduce(ReduceKind kind, const Tensor& x, const Attrs& attrs);

// dx for `kind`; `out` is the forward output (read by max / min / amax / amin only, may be
// undefined otherwise), `dout` has the output's shape and x's dtype.
Tensor reduce_backward(ReduceKind kind, const Tensor& x, const Tensor& out, const Tensor& dout, uint32_t mask,
                       bool keepdim);
Tensor reduce_backward(ReduceKind kind, const Tensor& x, const Tensor& out, const Tensor& dout, const Attrs& attrs);

}  // namespace shardwise::ops
