#pragma once
// Reference CPU kernels of layer_norm and rms_norm, forward and analytic backward.
//
// Both normalize every row of x over its trailing dims [k, ndim), k = begin_norm_axis
// (PaddlePaddle's attribute; a negative k counts from the end). The default here is -1, the last
// dim only (the usual transformer layer norm); Paddle's own default is 1.
// x is viewed as [rows, cols] with rows = prod(shape[:k]) and cols = prod(shape[k:]).
//  - layer_norm(x, scale, bias): mean = sum(x) / cols, var = sum((x - mean)^2) / cols (biased),
//    rstd = 1 / sqrt(var + epsilon), out = (x - mean) * rstd * scale + bias.
//  - rms_norm(x, scale): inv_rms = 1 / sqrt(sum(x^2) / cols + epsilon), out = x * inv_rms * scale.
// scale and bias are required and have the UNFLATTENED normalized shape x.shape[k:] (Paddle
// flattens it to one dim; keeping the dims lets a rule name them) and x's dtype.
// The statistics mean, rstd and inv_rms have x's leading shape x.shape[:k], NOT flattened, so their
// sharding is exactly that of x's leading dims; their dtype is x's (f32 for f16 / bf16 x).
// Floating dtypes only. Every row is computed in double and rounded once to the output dtype,
// so a row gives the same bits whichever rank holds it. rows == 0 (an empty shard) gives empty
// outputs; cols == 0 gives NaN statistics (0 / 0).
//
// Backward (xhat = (x - mean) * rstd for layer_norm, x * inv_rms for rms_norm, g = dout * scale):
//  - layer_norm: dx = rstd * (g - mean_row(g) - xhat * mean_row(g * xhat)),
//    dscale = sum over rows of dout * xhat, dbias = sum over rows of dout.
//  - rms_norm: dx = inv_rms * (g - xhat * mean_row(g * xhat)), dscale = sum over rows of dout * xhat.
// The saved statistics are read, not recomputed. Gradients flowing into the statistics outputs
// (mean, rstd, inv_rms) are IGNORED: they are by-products kept for the backward pass, not values a
// loss is meant to depend on (PaddlePaddle's layer_norm_grad ignores them the same way).
#include <string_view>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// begin_norm_axis from attrs (default -1), normalized into [0, ndim); Error naming `op` when out
// of range or when ndim == 0. Does not allocate (rules call it).
int norm_begin_axis(const Attrs& attrs, int ndim, std::string_view op);
// The same check for a given k (kernels take k as an argument).
int resolve_norm_axis(int64_t k, int ndim, std::string_view op);
inline double norm_epsilon(const Attrs& attrs, double fallback) { return attrs.get_float("epsilon", fallback); }
inline constexpr double kLayerNormEpsilon = 1e-5;
inline constexpr double kRmsNormEpsilon = 1e-6;

// x.shape[:k] (the statistics' shape) and x.shape[k:] (scale's and bias's shape).
Shape norm_leading_shape(const Shape& x, int k);
Shape norm_trailing_shape(const Shape& x, int k);
// The statistics' dtype: x's, or f32 for f16 / bf16.
DType norm_stat_dtype(DType x);
// Error naming `op` and `what` ("scale", "bias") unless x is floating and the parameter has shape
// x.shape[k:] and x's dtype.
void check_norm_param(std::string_view op, std::string_view what, const Shape& x_shape, DType x_dtype, int k,
                      const Shape& param_shape, DType param_dtype);

struct LayerNormOutputs {
  Tensor out, mean, rstd;
};
struct LayerNormGrads {
  Tensor dx, dscale, dbias;
};
LayerNormOutputs layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, int begin_norm_axis,
                            double epsilon);
LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& dout, int begin_norm_axis);

struct RmsNormOutputs {
  Tensor out, inv_rms;
};
struct RmsNormGrads {
  Tensor dx, dscale;
};
RmsNormOutputs rms_norm(const Tensor& x, const Tensor& scale, int begin_norm_axis, double epsilon);
RmsNormGrads rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dout,
                               int begin_norm_axis);

}  // namespace shardwise::ops
