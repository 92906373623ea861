// The channel normalizations: batch_norm, sync_batch_norm, group_norm, instance_norm (kernels in
// kernels.h, rules in rules.cc).
//
// Attributes: epsilon (default 1e-5); data_format "NCHW" (default; also NC, NCL, NCDHW) or "NHWC"
// (also NLC, NDHWC) for batch_norm and group_norm; batch_norm: momentum (default 0.9, the weight of
// the old running value, PaddlePaddle's convention), training (bool, default true); group_norm:
// groups (required).
// Gradients: dx, dscale, dbias from the gradient of `out`; the running statistics take no gradient
// (undefined tensors) and the gradients of the running / saved outputs are ignored.
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/ops/families.h"
#include "shardwise/ops/channel_norm/rules.h"
#include "shardwise/ops/channel_norm/kernels.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

// x: a floating tensor of rank 2..max_rank; the [C] parameters share one dtype: x's, or f32 for
// an f16/bf16 x. Returns the parameters' dtype.
DType check_metas(std::string_view op, std::span<const TensorMeta> in, int channel_dim, int max_rank,
                  const char* const* names) {
  const TensorMeta& x = in[0];
  SW_CHECK(is_floating(x.dtype), "{}: x must be a floating tensor (f32, f64, f16, bf16), got {}", op,
           dtype_name(x.dtype));
  SW_CHECK(x.shape.ndim() >= 2 && x.shape.ndim() <= max_rank, "{}: x must have rank 2..{}, got shape {}", op,
           max_rank, x.shape.to_string());
  int64_t channels = x.shape[channel_dim];
  DType pt = in[1].dtype;
  SW_CHECK(pt == x.dtype || (is_half(x.dtype) && pt == DType::F32),
           "{}: scale holds {} but x holds {} (allowed: x's dtype, or f32 for an f16/bf16 x)", op, dtype_name(pt),
           dtype_name(x.dtype));
  for (size_t i = 1; i < in.size(); ++i) {
    SW_CHECK(in[i].shape.ndim() == 1 && in[i].shape[0] == channels,
             "{}: {} must be [{}] (one value per channel of x {}), got {}", op, names[i], channels,
             x.shape.to_string(), in[i].shape.to_string());
    SW_CHECK(in[i].dtype == pt, "{}: {} holds {} but scale holds {} (the parameters share one dtype)", op, names[i],
             dtype_name(in[i].dtype), dtype_name(pt));
  }
  return pt;
}

// A missing gradient of `out` counts as zeros.
Tensor grad_or_zeros(std::span<const Tensor> out_grads, const Tensor& like) {
  if (!out_grads.empty() && out_grads[0].defined()) return out_grads[0];
  return Tensor(like.dtype(), like.shape());
}

// ---- batch_norm

constexpr const char* kBatchNormNames[] = {"x", "scale", "bias", "running_mean", "running_var"};

std::vector<TensorMeta> batch_norm_infer(std::span<const TensorMeta> in, const Attrs& attrs) {
  BatchNormOptions o = batch_norm_options(attrs);
  int c_dim = channel_axis(in[0].shape.ndim(), o.channels_last);
  DType pt = check_metas("batch_norm", in, c_dim, 5, kBatchNormNames);
  TensorMeta stat{Shape{in[0].shape[c_dim]}, pt};
  return {in[0], stat, stat, stat, stat};
}

std::vector<Tensor> batch_norm_forward(std::span<const Tensor> in, const Attrs& attrs) {
  BatchNormOutputs r = batch_norm(in[0], in[1], in[2], in[3], in[4], batch_norm_options(attrs));
  return {r.out, r.running_mean, r.running_var, r.saved_mean, r.saved_rstd};
}

std::vector<Tensor> batch_norm_grad(std::span<const Tensor> in, std::span<const Tensor> out,
                                    std::span<const Tensor> out_grads, const Attrs& attrs) {
  SW_CHECK(in.size() == 5 && out.size() == 5, "batch_norm backward takes 5 inputs and 5 outputs");
  NormGrads g = batch_norm_backward(in[0], in[1], out[3], out[4], grad_or_zeros(out_grads, in[0]),
                                    batch_norm_options(attrs));
  return {g.dx, g.dscale, g.dbias, Tensor(), Tensor()};
}

VerifyCase bn_case(Shape x, DType dtype, bool training, const char* format = "NCHW") {
  int64_t c = x[channel_axis(x.ndim(), std::string_view(format) == "NHWC")];
  VerifyCase vc;
  vc.shapes = {x, {c}, {c}, {c}, {c}};
  vc.dtypes.assign(5, dtype);
  vc.attrs.set("training", training);
  vc.attrs.set("data_format", std::string(format));
  vc.attrs.set("momentum", 0.8);
  vc.values = {{}, {}, {}, {}, {Kind::Uniform, 0.5, 2.0}};  // running_var > 0
  return vc;
}

// 12x12 divides every mesh (co-sharding included); 5x7, 2x5x3, 3x2x5 do not; C = 1 (and N = 1 in
// inference) leaves shards empty on every mesh; training and inference, both formats, one f32.
std::vector<VerifyCase> batch_norm_cases() {
  const DType f64 = DType::F64;
  return {
      bn_case({12, 12}, f64, true),
      bn_case({12, 12}, f64, false),
      bn_case({5, 7}, f64, true),
      bn_case({2, 5, 3}, f64, false),
      bn_case({3, 2, 5}, f64, true, "NHWC"),
      bn_case({2, 1, 3}, f64, true),
      bn_case({1, 3, 4}, f64, false, "NHWC"),
      bn_case({2, 3, 2, 2}, f64, true),
      bn_case({7, 5}, DType::F32, true),
  };
}

// ---- sync_batch_norm

constexpr std::string_view kSyncBatchNorm = "sync_batch_norm";

// The group of ranks holding other parts of x's batch / spatial dims (every dim but C); null on
// one device.
comm::Communicator* batch_group(const Tensor& x, bool channels_last, const KernelContext& ctx) {
  uint32_t non_channel = (1u << x.ndim()) - 1u;
  non_channel &= ~(1u << channel_axis(x.ndim(), channels_last));
  return ctx.group_sharding(0, non_channel, kSyncBatchNorm);
}

// Every rank's (count, mean, M2), gathered and merged in group-rank order: the same bits on every
// rank (a sum / sum-of-squares all-reduce would be one collective too, but cancels catastrophically
// when |mean| >> std).
ChannelMoments gather_moments(comm::Communicator& group, const ChannelMoments& local) {
  const size_t nc = local.mean.size(), block = 2 * nc + 1;
  std::vector<double> mine(block), all(block * static_cast<size_t>(group.size()));
  mine[0] = static_cast<double>(local.count);  // exact below 2^53
  std::copy(local.mean.begin(), local.mean.end(), mine.begin() + 1);
  std::copy(local.m2.begin(), local.m2.end(), mine.begin() + 1 + static_cast<std::ptrdiff_t>(nc));
  group.all_gather(mine.data(), all.data(), static_cast<int64_t>(block), DType::F64);
  ChannelMoments merged{0, std::vector<double>(nc, 0.0), std::vector<double>(nc, 0.0)};
  for (size_t r = 0; r < static_cast<size_t>(group.size()); ++r) {
    auto it = all.begin() + static_cast<std::ptrdiff_t>(r * block);
    ChannelMoments part{static_cast<int64_t>(it[0]), {it + 1, it + 1 + static_cast<std::ptrdiff_t>(nc)},
                        {it + 1 + static_cast<std::ptrdiff_t>(nc), it + static_cast<std::ptrdiff_t>(block)}};
    merge_channel_moments(merged, part);
  }
  return merged;
}

std::vector<Tensor> sync_batch_norm_forward(std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
  BatchNormOptions o = batch_norm_options(attrs);
  if (!o.training) return batch_norm_forward(in, attrs);  // running statistics: nothing to share
  ChannelMoments m = batch_norm_local_moments(in[0], o.channels_last);
  if (comm::Communicator* group = batch_group(in[0], o.channels_last, ctx)) m = gather_moments(*group, m);
  BatchNormOutputs r =
      batch_norm_with_stats(in[0], in[1], in[2], in[3], in[4], batch_norm_stats(m), m.count, o, kSyncBatchNorm);
  return {r.out, r.running_mean, r.running_var, r.saved_mean, r.saved_rstd};
}

std::vector<Tensor> sync_batch_norm_grad(std::span<const Tensor> in, std::span<const Tensor> out,
                                         std::span<const Tensor> out_grads, const Attrs& attrs,
                                         const KernelContext& ctx) {
  BatchNormOptions o = batch_norm_options(attrs);
  if (!o.training) return batch_norm_grad(in, out, out_grads, attrs);
  SW_CHECK(in.size() == 5 && out.size() == 5, "sync_batch_norm backward takes 5 inputs and 5 outputs");
  Tensor dy = grad_or_zeros(out_grads, in[0]);
  ChannelGradSums sums = batch_norm_local_grad_sums(in[0], dy, out[3], out[4], o.channels_last);
  // [sum(dy) | sum(dy * xhat) | count]: one all-reduce; the sums are well conditioned (xhat is
  // centred), so summing them is sound.
  const size_t nc = sums.sum_dy.size();
  std::vector<double> buf(sums.sum_dy);
  buf.insert(buf.end(), sums.sum_dy_xhat.begin(), sums.sum_dy_xhat.end());
  int64_t count = 1;  // values per channel here: the product of the non-channel extents
  for (int d = 0; d < in[0].ndim(); ++d) {
    if (d != channel_axis(in[0].ndim(), o.channels_last)) count *= in[0].shape()[d];
  }
  buf.push_back(static_cast<double>(count));
  if (comm::Communicator* group = batch_group(in[0], o.channels_last, ctx)) {
    group->all_reduce(buf.data(), buf.data(), static_cast<int64_t>(buf.size()), DType::F64, comm::Reduce::Sum);
  }
  std::copy(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(nc), sums.sum_dy.begin());
  std::copy(buf.begin() + static_cast<std::ptrdiff_t>(nc), buf.end() - 1, sums.sum_dy_xhat.begin());
  NormGrads g = batch_norm_backward_from_sums(in[0], in[1], out[3], out[4], dy, sums,
                                              static_cast<int64_t>(buf.back()), o);
  return {g.dx, g.dscale, g.dbias, Tensor(), Tensor()};
}

// Training with the batch sharded is the point: 12x12 (even), 5x7 and NHWC 3x2x5 (uneven), 2x1x3
// (C = 1: empty channel shards) and 2x3x2x2 (N = 2: empty batch shards on [3]); inference once;
// one f32 case.
std::vector<VerifyCase> sync_batch_norm_cases() {
  const DType f64 = DType::F64;
  return {
      bn_case({12, 12}, f64, true),        bn_case({5, 7}, f64, true),   bn_case({3, 2, 5}, f64, true, "NHWC"),
      bn_case({2, 1, 3}, f64, true),       bn_case({2, 3, 2, 2}, f64, true), bn_case({2, 5, 3}, f64, false),
      bn_case({7, 5}, DType::F32, true),
  };
}

// ---- group_norm

constexpr const char* kNormNames[] = {"x", "scale", "bias"};

std::vector<TensorMeta> group_norm_infer(std::span<const TensorMeta> in, const Attrs& attrs) {
  GroupNormOptions o = group_norm_options(attrs);
  int c_dim = channel_axis(in[0].shape.ndim(), o.channels_last);
  DType pt = check_metas("group_norm", in, c_dim, kMaxDims, kNormNames);
  group_norm_channels_per_group(in[0].shape[c_dim], o.groups);
  TensorMeta stat{Shape{in[0].shape[0], o.groups}, pt};
  return {in[0], stat, stat};
}

// The channel block of x this rank holds, from the kernel context (x is tensor 0).
ChannelShard channel_shard(const Tensor& x, bool channels_last, const KernelContext& ctx) {
  int c_dim = channel_axis(x.ndim(), channels_last);
  SW_CHECK(!ctx.tensors.empty() && ctx.tensors[0].global_shape.ndim() == x.ndim(),
           "group_norm: the kernel context does not describe x {}", x.shape().to_string());
  return {ctx.tensors[0].global_shape[c_dim], ctx.tensors[0].offset[static_cast<size_t>(c_dim)]};
}

std::vector<Tensor> group_norm_forward(std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
  GroupNormOptions o = group_norm_options(attrs);
  NormOutputs r = group_norm(in[0], in[1], in[2], o, channel_shard(in[0], o.channels_last, ctx));
  return {r.out, r.mean, r.rstd};
}

std::vector<Tensor> group_norm_grad(std::span<const Tensor> in, std::span<const Tensor> out,
                                    std::span<const Tensor> out_grads, const Attrs& attrs, const KernelContext& ctx) {
  SW_CHECK(in.size() == 3 && out.size() == 3, "group_norm backward takes 3 inputs and 3 outputs");
  GroupNormOptions o = group_norm_options(attrs);
  NormGrads g = group_norm_backward(in[0], in[1], out[1], out[2], grad_or_zeros(out_grads, in[0]), o,
                                    channel_shard(in[0], o.channels_last, ctx));
  return {g.dx, g.dscale, g.dbias};
}

VerifyCase norm_case(Shape x, DType dtype, Attrs attrs, bool channels_last = false) {
  int64_t c = x[channel_axis(x.ndim(), channels_last)];
  return VerifyCase{{x, {c}, {c}}, {dtype, dtype, dtype}, std::move(attrs), {}};
}

Attrs groups_attrs(int64_t groups, const char* format = "NCHW") {
  return Attrs{{"groups", groups}, {"data_format", std::string(format)}};
}

// C = 6 with 2 and 3 groups: on mesh [2] (chunks of 3) 2 groups keep a sharded C and 3 groups do
// not; on [3] (chunks of 2) the reverse. 12x12 with 6 groups divides every mesh; N = 1 and N = 2
// leave empty batch shards; groups = C and groups = 1; NHWC; one f32 case.
std::vector<VerifyCase> group_norm_cases() {
  const DType f64 = DType::F64;
  return {
      norm_case({12, 12}, f64, groups_attrs(6)),
      norm_case({2, 6, 3}, f64, groups_attrs(3)),
      norm_case({2, 6, 3}, f64, groups_attrs(2)),
      norm_case({3, 2, 6}, f64, groups_attrs(3, "NHWC"), true),
      norm_case({1, 6, 2}, f64, groups_attrs(2)),
      norm_case({5, 4, 2}, f64, groups_attrs(4)),
      norm_case({2, 5, 3}, f64, groups_attrs(1)),
      norm_case({3, 4, 2}, DType::F32, groups_attrs(2)),
  };
}

// ---- instance_norm

std::vector<TensorMeta> instance_norm_infer(std::span<const TensorMeta> in, const Attrs&) {
  check_instance_norm_rank(in[0].shape.ndim());
  DType pt = check_metas("instance_norm", in, 1, 5, kNormNames);
  TensorMeta stat{Shape{in[0].shape[0], in[0].shape[1]}, pt};
  return {in[0], stat, stat};
}

std::vector<Tensor> instance_norm_forward(std::span<const Tensor> in, const Attrs& attrs) {
  NormOutputs r = instance_norm(in[0], in[1], in[2], attrs.get_float("epsilon", 1e-5));
  return {r.out, r.mean, r.rstd};
}

std::vector<Tensor> instance_norm_grad(std::span<const Tensor> in, std::span<const Tensor> out,
                                       std::span<const Tensor> out_grads, const Attrs&) {
  SW_CHECK(in.size() == 3 && out.size() == 3, "instance_norm backward takes 3 inputs and 3 outputs");
  NormGrads g = instance_norm_backward(in[0], in[1], out[1], out[2], grad_or_zeros(out_grads, in[0]));
  return {g.dx, g.dscale, g.dbias};
}

// 12x12x12 is the smallest rank-3 x that divides every mesh; 2x6x3, 5x3x2 do not; N = 1 and C = 1
// leave empty shards; one f32 case.
std::vector<VerifyCase> instance_norm_cases() {
  const DType f64 = DType::F64;
  return {
      norm_case({12, 12, 12}, f64, {}),
      norm_case({2, 6, 3}, f64, {}),
      norm_case({5, 3, 2}, f64, Attrs{{"epsilon", 1e-3}}),
      norm_case({1, 4, 3}, f64, {}),
      norm_case({3, 1, 2, 2}, f64, {}),
      norm_case({3, 5, 2}, DType::F32, {}),
  };
}

}  // namespace

void register_channel_norm_ops(OpRegistry& registry) {
  OpDef bn;
  bn.name = "batch_norm";
  bn.family = "channel_norm";
  bn.rule = rules_of<channel_norm_rules>().batch_norm;
  bn.summary =
      "batch_norm(x, scale, bias, running_mean, running_var; momentum=0.9, epsilon=1e-5, training=true, "
      "data_format=NCHW|NHWC) -> out, running_mean_out, running_var_out, saved_mean, saved_rstd. Training: batch "
      "statistics per channel over every other dim; running = momentum * running + (1 - momentum) * batch "
      "(PaddlePaddle's momentum), the running var with the UNBIASED batch variance n/(n-1); saved = batch mean and "
      "1/sqrt(biased var + eps). Inference: running statistics, passed through. Grad: dx, dscale, dbias";
  bn.num_inputs = 5;
  bn.num_outputs = 5;
  bn.infer = batch_norm_infer;
  bn.forward = batch_norm_forward;
  bn.backward = batch_norm_grad;
  bn.cases = batch_norm_cases();
  registry.add(std::move(bn));

  OpDef sbn;
  sbn.name = "sync_batch_norm";
  sbn.family = "channel_norm";
  sbn.rule = rules_of<channel_norm_rules>().sync_batch_norm;
  sbn.summary =
      "sync_batch_norm: batch_norm's inputs, attributes and outputs; training statistics over the GLOBAL batch "
      "although the batch/spatial dims stay sharded: the kernel all-gathers every rank's per-channel (count, mean, "
      "M2) along the mesh dims sharding them and merges them in rank order (Chan et al.), so out, saved stats and "
      "the running update (unbiased with the global count) equal batch_norm over the global batch. Grad: one "
      "all-reduce of [sum(dy), sum(dy * xhat), count] per channel; dx, dscale, dbias. Inference: batch_norm (no "
      "communication)";
  sbn.num_inputs = 5;
  sbn.num_outputs = 5;
  sbn.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) { return batch_norm_infer(in, attrs); };
  sbn.forward_in_context = sync_batch_norm_forward;
  sbn.backward_in_context = sync_batch_norm_grad;
  sbn.collective = true;
  sbn.cases = sync_batch_norm_cases();
  registry.add(std::move(sbn));

  OpDef gn;
  gn.name = "group_norm";
  gn.family = "channel_norm";
  gn.rule = rules_of<channel_norm_rules>().group_norm;
  gn.summary =
      "group_norm(x, scale, bias; groups, epsilon=1e-5, data_format=NCHW|NHWC) -> out, mean [N, groups], rstd "
      "[N, groups]: statistics per (sample, group of C/groups consecutive channels) over the group's channels and "
      "spatial dims; scale/bias per channel. Grad: dx, dscale, dbias. The local kernel reads x's global channel "
      "offset from the kernel context (a rank may hold whole groups only)";
  gn.num_inputs = 3;
  gn.num_outputs = 3;
  gn.infer = group_norm_infer;
  gn.forward_in_context = group_norm_forward;
  gn.backward_in_context = group_norm_grad;
  gn.cases = group_norm_cases();
  registry.add(std::move(gn));

  OpDef in;
  in.name = "instance_norm";
  in.family = "channel_norm";
  in.rule = rules_of<channel_norm_rules>().instance_norm;
  in.summary =
      "instance_norm(x, scale, bias; epsilon=1e-5), x [N, C, spatial...] of rank 3..5 -> out, saved_mean [N, C], "
      "saved_rstd [N, C]: statistics per (sample, channel) over the spatial dims; scale/bias per channel. Grad: dx, "
      "dscale, dbias";
  in.num_inputs = 3;
  in.num_outputs = 3;
  in.infer = instance_norm_infer;
  in.forward = instance_norm_forward;
  in.backward = instance_norm_grad;
  in.cases = instance_norm_cases();
  registry.add(std::move(in));
}

}  // namespace shardwise::ops
