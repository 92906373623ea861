#pragma once
// Reference CPU kernels of the channel normalizations: batch_norm, group_norm, instance_norm,
// forward and analytic backward.
//
// Layout: x has rank >= 2 with the batch dim N first; the channel dim C is dim 1 ("NCHW" and its
// aliases "NC", "NCL", "NCDHW") or the last dim ("NHWC", "NLC", "NDHWC"); the other dims are
// spatial. A rank-2 x is [N, C] in both formats. scale and bias are [C].
//
// Dtypes: x is f32, f64, f16 or bf16; scale, bias (and batch_norm's running statistics) have
// x's dtype, or f32 when x is f16/bf16 (PaddlePaddle's mixed-precision convention). Saved
// statistics take the parameters' dtype. Everything is computed in double.
//
// Statistics use sums of x and x^2 (accumulated in double): the batch-norm sums are exactly what a
// data-parallel sync_batch_norm all-reduces, so the local-sum functions below are separate. The
// variance is the biased one, max(0, E[x^2] - E[x]^2); rstd = 1 / sqrt(var + epsilon).
#include <cstdint>
#include <string_view>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// True for a channels-last data_format ("NHWC", "NLC", "NDHWC"), false for channels-first
// ("NCHW" — the default — "NC", "NCL", "NCDHW"); Error naming `op` and the accepted values
// otherwise. Reads the attribute without allocating (rules call it).
bool channels_last_format(const Attrs& attrs, std::string_view op);
// The channel dim of a rank-`ndim` x (1, or ndim - 1 when channels_last).
inline int channel_axis(int ndim, bool channels_last) { return channels_last ? ndim - 1 : 1; }

// ---------------------------------------------------------------------------------------------
// batch_norm(x, scale, bias, running_mean, running_var)
//   -> out, running_mean_out, running_var_out, saved_mean, saved_rstd   (all but out are [C])
// Training: mean and biased var per channel over every dim but C;
//   out = (x - mean) * rstd * scale + bias, rstd = 1 / sqrt(var + epsilon);
//   running_mean_out = momentum * running_mean + (1 - momentum) * mean   (PaddlePaddle's momentum:
//   the weight of the OLD value, default 0.9);
//   running_var_out  = momentum * running_var + (1 - momentum) * var * n / (n - 1)   (the UNBIASED
//   batch variance, n = elements per channel; n <= 1 is an Error, as in PyTorch);
//   saved_mean = mean, saved_rstd = rstd.
// Inference: normalizes with the running statistics; running_*_out are copies of running_*;
//   saved_mean = running_mean, saved_rstd = 1 / sqrt(running_var + epsilon).
struct BatchNormOptions {
  double momentum = 0.9;
  double epsilon = 1e-5;
  bool training = true;
  bool channels_last = false;
};
// Reads momentum, epsilon, training (bool) and data_format.
BatchNormOptions batch_norm_options(const Attrs& attrs);

struct BatchNormOutputs {
  Tensor out, running_mean, running_var, saved_mean, saved_rstd;
};
BatchNormOutputs batch_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, const BatchNormOptions& options);

// Per-channel sums over this tensor's elements: what sync_batch_norm all-reduces (sum) across
// the ranks that split the batch before turning them into statistics.
struct ChannelSums {
  int64_t count = 0;           // elements per channel (the product of the non-channel extents)
  std::vector<double> sum;     // [C] sum of x
  std::vector<double> sum_sq;  // [C] sum of x^2
};
ChannelSums batch_norm_local_sums(const Tensor& x, bool channels_last);
// mean = sum / count and the biased var = max(0, sum_sq / count - mean^2); count 0 gives NaN.
struct ChannelStats {
  std::vector<double> mean, var;
};
ChannelStats batch_norm_stats(const ChannelSums& sums);

// Per-channel moments: count, mean and M2 = sum((x - mean)^2), two passes over the data (no
// E[x^2] - E[x]^2 cancellation, which loses every digit of the variance once |mean| >> std).
// sync_batch_norm gathers every rank's moments and merges them in rank order: one collective,
// sound, and the same bits on every rank. count 0 gives mean = M2 = 0.
struct ChannelMoments {
  int64_t count = 0;
  std::vector<double> mean, m2;  // [C]
};
ChannelMoments batch_norm_local_moments(const Tensor& x, bool channels_last);
// Chan et al.'s pairwise update: `into` becomes the moments of both parts (an empty part is a
// no-op). Error unless both hold the same channel count.
void merge_channel_moments(ChannelMoments& into, const ChannelMoments& part);
// mean and the biased var = M2 / count (count 0 gives NaN).
ChannelStats batch_norm_stats(const ChannelMoments& moments);

// The training forward from statistics already computed over `count` values per channel (the
// local batch for batch_norm, the global one for sync_batch_norm): out, the running-statistics
// update (unbiased variance with this count; count <= 1 is an Error naming `op`) and the saved
// statistics.
BatchNormOutputs batch_norm_with_stats(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var, const ChannelStats& stats,
                                       int64_t count, const BatchNormOptions& options,
                                       std::string_view op = "batch_norm");

// The two per-channel reductions of the training gradient: sum(dy) and sum(dy * xhat) with
// xhat = (x - mean) * rstd; sync_batch_norm all-reduces them too.
struct ChannelGradSums {
  std::vector<double> sum_dy, sum_dy_xhat;  // [C]
};
ChannelGradSums batch_norm_local_grad_sums(const Tensor& x, const Tensor& dy, const Tensor& saved_mean,
                                           const Tensor& saved_rstd, bool channels_last);

// dx, dscale, dbias from the forward input x, scale, the forward's saved_mean / saved_rstd and dy
// (the gradient of `out`; the running and saved outputs take no gradient).
//   dbias = sum(dy), dscale = sum(dy * xhat)      (per channel, over every non-channel dim)
//   training:  dx = scale * rstd / n * (n * dy - dbias - xhat * dscale)
//   inference: dx = scale * rstd * dy              (the statistics are constants)
struct NormGrads {
  Tensor dx, dscale, dbias;
};
NormGrads batch_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& saved_mean, const Tensor& saved_rstd,
                              const Tensor& dy, const BatchNormOptions& options);
// The training dx and the parameter grads from already-reduced sums (count = n per channel).
NormGrads batch_norm_backward_from_sums(const Tensor& x, const Tensor& scale, const Tensor& saved_mean,
                                        const Tensor& saved_rstd, const Tensor& dy, const ChannelGradSums& sums,
                                        int64_t count, const BatchNormOptions& options);

// ---------------------------------------------------------------------------------------------
// group_norm(x, scale, bias; groups, epsilon, data_format) -> out, mean [N, groups], rstd [N, groups]
// The C channels form `groups` consecutive groups of C / groups channels; mean and biased var per
// (sample, group) over the group's channels and every spatial position.
//   out = (x - mean) * rstd * scale[c] + bias[c].
// Backward, per (sample, group) with M elements, g = dy * scale[c]:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dscale = sum_{n, spatial} dy * xhat;
//   dbias = sum_{n, spatial} dy.
//
// Sharded over C (on group boundaries), a rank holds only some groups: `shard` gives the GLOBAL
// channel count (that `groups` refers to) and the global offset of x's first channel; both the
// local channel count and the offset must be multiples of C / groups (Error otherwise). The
// default describes an unsharded x.
struct GroupNormOptions {
  int64_t groups = 1;
  double epsilon = 1e-5;
  bool channels_last = false;
};
GroupNormOptions group_norm_options(const Attrs& attrs);  // groups (required), epsilon, data_format
struct ChannelShard {
  int64_t global_channels = -1;  // -1: x's own channel count
  int64_t channel_offset = 0;
};
// The number of channels per group; Error unless groups >= 1 divides global_channels >= groups.
int64_t group_norm_channels_per_group(int64_t global_channels, int64_t groups);

struct NormOutputs {
  Tensor out, mean, rstd;
};
NormOutputs group_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, const GroupNormOptions& options,
                       const ChannelShard& shard = {});
NormGrads group_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dy, const GroupNormOptions& options, const ChannelShard& shard = {});

// ---------------------------------------------------------------------------------------------
// instance_norm(x, scale, bias; epsilon) -> out, saved_mean [N, C], saved_rstd [N, C]
// x is [N, C, spatial...] of rank 3, 4 or 5 (channels first): group_norm with one channel per
// group, so statistics per (sample, channel) over the spatial dims; same backward.
NormOutputs instance_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, double epsilon);
NormGrads instance_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& saved_mean,
                                 const Tensor& saved_rstd, const Tensor& dy);
// Error naming the op unless x's rank is 3..5.
void check_instance_norm_rank(int ndim);

}  // namespace shardwise::ops
