// SPMD rules of the channel normalizations: batch_norm, sync_batch_norm, group_norm, instance_norm.
//
// Labels: x's dims are "ab.." (batch 'a' first); the channel dim (1, or the last for a
// channels-last data_format) has the channel letter; scale, bias and batch_norm's running / saved
// statistics are [C], labelled with it; group_norm's mean / rstd [N, groups] and instance_norm's
// saved statistics [N, C] are labelled (batch letter, channel letter): the groups dim is sharded
// exactly like C (when C is split on group boundaries, the chunks of C are the chunks of the
// groups times C / groups). Shardings merge with merge_axes in argument order (x first); every
// Partial input is resharded to Replicate (normalization is not linear in x, nor in the
// parameters jointly), so no forward output is ever Partial.
//
// batch_norm: per-channel statistics need no communication, so C may stay sharded and every [C]
//  tensor (parameters, running_*_out, saved_*) follows C's sharding (Shard, never Partial).
//  TRAINING: batch and spatial dims must be Replicate (local statistics would differ from the
//  global ones). INFERENCE: they may stay sharded (the op is elementwise per channel).
//  grad (x, scale, bias, running_mean, running_var, out, running_mean_out, running_var_out,
//  saved_mean, saved_rstd, dout, and the 4 other output grads -> dx, dscale, dbias, none, none):
//  x and dout share x's sharding (training: batch / spatial Replicate); scale, saved_mean,
//  saved_rstd follow C; dx is sharded like x; dscale / dbias Shard like C, and in inference
//  Partial(sum) on the mesh dims sharding batch / spatial (in training those are Replicate, so no
//  Partial arises). The running-stat grads do not exist: Replicate is claimed.
// sync_batch_norm: batch_norm's layouts with nothing required Replicate in training either: the
//  kernel merges the per-channel statistics of the ranks along the mesh dims sharding batch /
//  spatial dims, so every [C] output is the global statistic (Replicate on those mesh dims, Shard
//  like C). grad: dscale / dbias are Replicate on those mesh dims in training — the kernel must
//  all-reduce sum(dy) and sum(dy * xhat) to compute dx, and those ARE dbias and dscale, so a
//  Partial(sum) would save nothing and only make the graph reduce them a second time; in inference
//  (no reduction in the kernel) Partial(sum), as batch_norm.
// group_norm: statistics per (sample, group). The batch dim may stay sharded; spatial dims ->
//  Replicate; C may stay sharded only on group boundaries: with chunk semantics over the mesh dims
//  sharding C (in split order), every chunk boundary at every nesting level must be a multiple of
//  C / groups. The mesh dims are kept greedily in split order while that holds; the others ->
//  Replicate on C. mean / rstd follow N and (through the groups dim) C.
//  grad: dscale / dbias Shard like C and Partial(sum) on the mesh dims sharding N.
// instance_norm: group_norm with one channel per group (channels first): N and C may stay
//  sharded, spatial -> Replicate; saved statistics [N, C] follow them; dscale / dbias Shard like C
//  and Partial(sum) on the mesh dims sharding N.
// In every grad: x, dout and the read statistics / scale merge (x, dout, scale, statistics order).
//  The tensors the backward kernel does not read are asked for the layout they have after the
//  forward, so that no reshard arises for them in a program: the forward outputs (out, running
//  stats out) keep their given distribution; the unread forward inputs (bias, running stats)
//  follow C like scale; the ignored gradients of the statistics outputs take their output's given
//  distribution. (Keeping every unread input as given would spare even a reshard of a parameter
//  stored in another layout, but makes every enumerated placement combination a distinct layout
//  for the verifier to run: about 100x slower verification.)
//  On a mesh dim that shards nothing, a dout Partial(sum|avg) passes to dx, dscale and dbias (all
//  linear in dout; x, scale and the statistics are Replicate there); any other Partial -> R.
// Reverse rules merge the wanted outputs the same way (out, then the statistics), apply the same
//  Replicate requirements and return the forward layout of the inputs that results: consistent
//  pairs. A wanted Partial output cannot be produced: Replicate.
#include <array>

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
#include "shardwise/ops/channel_norm/rules.h"
#include "shardwise/ops/channel_norm/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

constexpr std::string_view kBatchNorm = "batch_norm";
constexpr std::string_view kSyncBatchNorm = "sync_batch_norm";
constexpr std::string_view kGroupNorm = "group_norm";
constexpr std::string_view kInstanceNorm = "instance_norm";

// Letters of x and of its dims groups, in inline buffers (no allocation).
struct Labels {
  std::array<char, kMaxDims> x_buf{}, spatial_buf{}, non_channel_buf{};
  std::array<char, 2> stat_buf{};
  char channel = 0;
  int nx = 0, nspatial = 0, nnon_channel = 0;

  Labels(int ndim, int channel_dim) : nx(ndim) {
    for (int d = 0; d < ndim; ++d) {
      char letter = static_cast<char>('a' + d);
      x_buf[static_cast<size_t>(d)] = letter;
      if (d == channel_dim) {
        channel = letter;
        continue;
      }
      non_channel_buf[static_cast<size_t>(nnon_channel++)] = letter;
      if (d != 0) spatial_buf[static_cast<size_t>(nspatial++)] = letter;
    }
    stat_buf = {'a', channel};
  }
  std::string_view x() const { return {x_buf.data(), static_cast<size_t>(nx)}; }
  std::string_view c() const { return {&channel, 1}; }
  std::string_view spatial() const { return {spatial_buf.data(), static_cast<size_t>(nspatial)}; }
  std::string_view non_channel() const { return {non_channel_buf.data(), static_cast<size_t>(nnon_channel)}; }
  std::string_view stat() const { return {stat_buf.data(), 2}; }
};

// x of rank min_rank..max_rank and the [C] tensors at `params`.
void check_shapes(std::string_view name, std::span<const TensorSpec> t, int channel_dim, int min_rank, int max_rank,
                  std::initializer_list<size_t> params) {
  const Shape& x = t[0].shape;
  SW_CHECK(x.ndim() >= min_rank && x.ndim() <= max_rank, "{}: x must have rank {}..{}, got shape {}", name, min_rank,
           max_rank, x.to_string());
  for (size_t i : params) {
    SW_CHECK(t[i].shape.ndim() == 1 && t[i].shape[0] == x[channel_dim],
             "{}: tensor {} must be [{}] (one value per channel of x {}), got {}", name, i, x[channel_dim],
             x.to_string(), t[i].shape.to_string());
  }
}

void check_stat_shapes(std::string_view name, std::span<const TensorSpec> t, const Shape& want,
                       std::initializer_list<size_t> stats) {
  for (size_t i : stats) {
    SW_CHECK(t[i].shape == want, "{}: tensor {} must be {}, got {}", name, i, want.to_string(),
             t[i].shape.to_string());
  }
}

// On each mesh dim sharding nothing, the first linear Partial of dout passes to the grads at
// `grads` (x, scale and the statistics stay Replicate there).
void pass_dout_partial(SpmdResult& r, const AxisMap& axes, const TensorSpec& dout, size_t dout_index,
                       std::initializer_list<size_t> grads) {
  for (int m = 0; m < dout.dist.mesh_ndim(); ++m) {
    const Placement& p = dout.dist[m];
    if (axes.letter_of(m) != 0 || !is_linear_partial(p)) continue;
    r.inputs[dout_index].set(m, p);
    for (size_t g : grads) r.outputs[g].set(m, p);
  }
}

// ---- batch_norm

struct BatchNormSetup {
  Labels labels;
  bool training;
  bool sync;  // sync_batch_norm: the kernel shares the statistics, so nothing must be replicated
  std::string_view replicated() const {
    return training && !sync ? labels.non_channel() : std::string_view();
  }
  // Training sync_batch_norm all-reduces dscale / dbias in the kernel (dx needs those sums), so
  // they come out Replicate; inference has no reduction, so they are Partial(sum) there.
  bool partial_param_grads() const { return !training; }
};

// `name` is batch_norm or sync_batch_norm (the same labels and layouts).
BatchNormSetup batch_norm_setup(std::string_view name, const Shape& x, const Attrs& attrs) {
  SW_CHECK(x.ndim() >= 2 && x.ndim() <= 5, "{}: x must have rank 2..5, got shape {}", name, x.to_string());
  bool last = channels_last_format(attrs, name);
  return {Labels(x.ndim(), channel_axis(x.ndim(), last)), attrs.get_bool("training", true), name == kSyncBatchNorm};
}

// Inputs x + 4 [C] tensors; outputs out + 4 [C] statistics.
SpmdResult batch_norm_layout(const Labels& l, const AxisMap& axes, int nd) {
  SpmdResult r;
  DistAttr x = dist_from_axes(l.x(), axes, nd);
  DistAttr c = dist_from_axes(l.c(), axes, nd);
  r.inputs = {x, c, c, c, c};
  r.outputs = {x, c, c, c, c};
  return r;
}

SpmdResult batch_norm_forward(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                              const Attrs& attrs) {
  check_inputs(name, mesh, in, 5);
  BatchNormSetup s = batch_norm_setup(name, in[0].shape, attrs);
  const Labels& l = s.labels;
  check_shapes(name, in, l.channel - 'a', 2, 5, {1, 2, 3, 4});
  std::string_view c = l.c();
  AxisMap axes = merge_axes({l.x(), c, c, c, c}, {in[0].dist, in[1].dist, in[2].dist, in[3].dist, in[4].dist},
                            s.replicated());
  return batch_norm_layout(l, axes, mesh.ndim());
}

SpmdResult batch_norm_reverse(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                              std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs(name, mesh, in, 5);
  check_inputs(name, mesh, out, 5);
  BatchNormSetup s = batch_norm_setup(name, in[0].shape, attrs);
  const Labels& l = s.labels;
  check_shapes(name, in, l.channel - 'a', 2, 5, {1, 2, 3, 4});
  SW_CHECK(out[0].shape == in[0].shape, "{} reverse: out {} must have x's shape {}", name,
           out[0].shape.to_string(), in[0].shape.to_string());
  check_stat_shapes(name, out, in[1].shape, {1, 2, 3, 4});
  std::string_view c = l.c();
  AxisMap axes = merge_axes({l.x(), c, c, c, c}, {out[0].dist, out[1].dist, out[2].dist, out[3].dist, out[4].dist},
                            s.replicated());
  return batch_norm_layout(l, axes, mesh.ndim());
}

// Grad inputs: 0 x, 1 scale, 2 bias, 3 running_mean, 4 running_var, 5 out, 6 running_mean_out,
// 7 running_var_out, 8 saved_mean, 9 saved_rstd, 10 dout, 11..14 grads of outputs 1..4.
SpmdResult batch_norm_grad(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                           const Attrs& attrs) {
  check_inputs(name, mesh, in, 15);
  BatchNormSetup s = batch_norm_setup(name, in[0].shape, attrs);
  const Labels& l = s.labels;
  check_shapes(name, in, l.channel - 'a', 2, 5, {1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14});
  SW_CHECK(in[5].shape == in[0].shape && in[10].shape == in[0].shape,
           "{} grad: out {} and dout {} must have x's shape {}", name, in[5].shape.to_string(),
           in[10].shape.to_string(), in[0].shape.to_string());
  int nd = mesh.ndim();
  std::string_view c = l.c();
  AxisMap axes = merge_axes({l.x(), l.x(), c, c, c}, {in[0].dist, in[10].dist, in[1].dist, in[8].dist, in[9].dist},
                            s.replicated());
  DistAttr x = dist_from_axes(l.x(), axes, nd);
  DistAttr cd = dist_from_axes(c, axes, nd);
  SpmdResult r;
  r.inputs.reserve(15);
  for (size_t i = 0; i < 15; ++i) r.inputs.push_back(in[i].dist);  // the forward outputs as given
  r.inputs[0] = r.inputs[10] = x;
  for (size_t i = 1; i <= 4; ++i) r.inputs[i] = cd;  // scale (read); bias, running stats as in forward
  r.inputs[8] = r.inputs[9] = cd;
  for (size_t i = 11; i <= 14; ++i) r.inputs[i] = in[i - 5].dist;  // ignored grads: their output's layout
  DistAttr dparam = cd;
  if (s.partial_param_grads()) add_partial_for(dparam, l.non_channel(), axes, ReduceOp::Sum);
  r.outputs = {x, dparam, dparam, DistAttr(nd), DistAttr(nd)};
  pass_dout_partial(r, axes, in[10], 10, {0, 1, 2});
  return r;
}

// ---- group_norm and instance_norm

// Whether splitting `len` channels (a multiple of cpg) over dims[i..] (chunk semantics, nested in
// order) puts every chunk boundary on a multiple of cpg. At each level the chunks are full ones of
// ceil(len / k), then one remainder, then empty ones: only those two lengths recurse.
bool group_aligned(int64_t len, const ProcessMesh& mesh, const MeshDimList& dims, int i, int64_t cpg) {
  if (len == 0 || i == dims.size()) return true;
  int64_t k = mesh.dim_size(dims[i]);
  int64_t step = (len + k - 1) / k;
  if (step % cpg != 0) return false;
  return group_aligned(step, mesh, dims, i + 1, cpg) && group_aligned(len % step, mesh, dims, i + 1, cpg);
}

// Keeps, greedily in split order, the mesh dims sharding C under which every chunk boundary stays
// on a group boundary; the dropped mesh dims leave C Replicate there.
void keep_group_aligned(AxisMap& axes, char channel, int64_t channels, int64_t cpg, const ProcessMesh& mesh) {
  if (cpg == 1) return;
  MeshDimList& dims = axes[channel];
  MeshDimList kept;
  for (int m : dims) {
    MeshDimList trial = kept;
    trial.push_back(m);
    if (group_aligned(channels, mesh, trial, 0, cpg)) kept = trial;
  }
  dims = kept;
}

struct GroupSetup {
  Labels labels;
  int64_t channels = 0;
  int64_t cpg = 1;  // channels per group
  int64_t groups = 0;
};

GroupSetup group_setup(std::string_view name, std::span<const TensorSpec> in, const Attrs& attrs) {
  const Shape& x = in[0].shape;
  if (name == kInstanceNorm) {
    SW_CHECK(x.ndim() >= 3 && x.ndim() <= 5, "instance_norm: x must have rank 3..5, got shape {}", x.to_string());
    return {Labels(x.ndim(), 1), x[1], 1, x[1]};
  }
  SW_CHECK(x.ndim() >= 2, "group_norm: x must have rank >= 2, got shape {}", x.to_string());
  int c_dim = channel_axis(x.ndim(), channels_last_format(attrs, kGroupNorm));
  int64_t groups = attrs.get_int("groups");
  int64_t cpg = group_norm_channels_per_group(x[c_dim], groups);
  return {Labels(x.ndim(), c_dim), x[c_dim], cpg, groups};
}

AxisMap group_axes(const GroupSetup& s, std::initializer_list<std::string_view> notations,
                   std::initializer_list<DistAttr> dists, const ProcessMesh& mesh) {
  AxisMap axes = merge_axes(notations, dists, s.labels.spatial());
  keep_group_aligned(axes, s.labels.channel, s.channels, s.cpg, mesh);
  return axes;
}

// Inputs x, scale, bias; outputs out, mean, rstd.
SpmdResult group_layout(const Labels& l, const AxisMap& axes, int nd) {
  SpmdResult r;
  DistAttr x = dist_from_axes(l.x(), axes, nd);
  DistAttr c = dist_from_axes(l.c(), axes, nd);
  DistAttr stat = dist_from_axes(l.stat(), axes, nd);
  r.inputs = {x, c, c};
  r.outputs = {x, stat, stat};
  return r;
}

SpmdResult group_forward(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                         const Attrs& attrs) {
  check_inputs(name, mesh, in, 3);
  GroupSetup s = group_setup(name, in, attrs);
  const Labels& l = s.labels;
  check_shapes(name, in, l.channel - 'a', 2, kMaxDims, {1, 2});
  AxisMap axes = group_axes(s, {l.x(), l.c(), l.c()}, {in[0].dist, in[1].dist, in[2].dist}, mesh);
  return group_layout(l, axes, mesh.ndim());
}

SpmdResult group_reverse(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                         std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs(name, mesh, in, 3);
  check_inputs(name, mesh, out, 3);
  GroupSetup s = group_setup(name, in, attrs);
  const Labels& l = s.labels;
  check_shapes(name, in, l.channel - 'a', 2, kMaxDims, {1, 2});
  SW_CHECK(out[0].shape == in[0].shape, "{} reverse: out {} must have x's shape {}", name, out[0].shape.to_string(),
           in[0].shape.to_string());
  check_stat_shapes(name, out, Shape{in[0].shape[0], s.groups}, {1, 2});
  AxisMap axes = group_axes(s, {l.x(), l.stat(), l.stat()}, {out[0].dist, out[1].dist, out[2].dist}, mesh);
  return group_layout(l, axes, mesh.ndim());
}

// Grad inputs: 0 x, 1 scale, 2 bias, 3 out, 4 mean, 5 rstd, 6 dout, 7 dmean, 8 drstd.
SpmdResult group_grad(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                      const Attrs& attrs) {
  check_inputs(name, mesh, in, 9);
  GroupSetup s = group_setup(name, in, attrs);
  const Labels& l = s.labels;
  check_shapes(name, in, l.channel - 'a', 2, kMaxDims, {1, 2});
  SW_CHECK(in[3].shape == in[0].shape && in[6].shape == in[0].shape,
           "{} grad: out {} and dout {} must have x's shape {}", name, in[3].shape.to_string(),
           in[6].shape.to_string(), in[0].shape.to_string());
  check_stat_shapes(name, in, Shape{in[0].shape[0], s.groups}, {4, 5, 7, 8});
  int nd = mesh.ndim();
  AxisMap axes = group_axes(s, {l.x(), l.x(), l.c(), l.stat(), l.stat()},
                            {in[0].dist, in[6].dist, in[1].dist, in[4].dist, in[5].dist}, mesh);
  DistAttr x = dist_from_axes(l.x(), axes, nd);
  DistAttr c = dist_from_axes(l.c(), axes, nd);
  DistAttr stat = dist_from_axes(l.stat(), axes, nd);
  SpmdResult r;
  r.inputs.reserve(9);
  for (size_t i = 0; i < 9; ++i) r.inputs.push_back(in[i].dist);  // out as given
  r.inputs[0] = r.inputs[6] = x;
  r.inputs[1] = r.inputs[2] = c;  // scale (read); bias as in forward
  r.inputs[4] = r.inputs[5] = stat;
  r.inputs[7] = in[4].dist;  // ignored grads: their output's layout
  r.inputs[8] = in[5].dist;
  DistAttr dparam = c;
  add_partial_for(dparam, "a", axes, ReduceOp::Sum);
  r.outputs = {x, dparam, dparam};
  pass_dout_partial(r, axes, in[6], 6, {0, 1, 2});
  return r;
}

}  // namespace

ChannelNormRules channel_norm_rules() {
  ChannelNormRules r;
  r.batch_norm = named_rule(
      kBatchNorm,
      "C keeps its sharding and every [C] tensor (scale, bias, running stats in and out, saved stats) follows it "
      "(Shard, never Partial); training: batch/spatial dims -> R (statistics must be global); inference: they may "
      "stay sharded; Partial inputs -> R. Grad: dx like x, dscale/dbias Shard like C (+ P(sum) over sharded "
      "batch/spatial in inference); dout P(sum|avg) on a free mesh dim -> all grads the same; unread grad inputs "
      "are asked for their forward layout",
      batch_norm_forward, batch_norm_reverse, batch_norm_grad);
  r.sync_batch_norm = named_rule(
      kSyncBatchNorm,
      "batch_norm's layouts, but batch/spatial dims keep their sharding in training too (the kernel shares the "
      "statistics along the mesh dims sharding them); C keeps its sharding, every [C] tensor follows it and is "
      "Replicate on the batch-sharding mesh dims (global statistics); Partial inputs -> R. Grad: dx like x; "
      "dscale/dbias Shard like C and REPLICATE on the batch-sharding mesh dims in training (the kernel all-reduces "
      "sum(dy) and sum(dy * xhat) for dx anyway, so a Partial would only defer a second reduction), P(sum) there "
      "in inference (no reduction in the kernel); dout P(sum|avg) on a free mesh dim -> all grads the same",
      batch_norm_forward, batch_norm_reverse, batch_norm_grad);
  r.group_norm = named_rule(
      kGroupNorm,
      "N keeps its sharding; spatial -> R; C keeps a mesh dim only while every nested chunk boundary of C is a "
      "multiple of C/groups (greedy in split order), else R; scale/bias follow C, mean/rstd [N, groups] follow N "
      "and C; Partial inputs -> R. Grad: dscale/dbias Shard like C + P(sum) over the mesh dims sharding N; dout "
      "P(sum|avg) on a free mesh dim -> all grads the same; unread grad inputs are asked for their forward layout",
      group_forward, group_reverse, group_grad);
  r.instance_norm = named_rule(
      kInstanceNorm,
      "N and C keep their sharding; spatial -> R; scale/bias follow C, saved stats [N, C] follow N and C; Partial "
      "inputs -> R. Grad: dscale/dbias Shard like C + P(sum) over the mesh dims sharding N; dout P(sum|avg) on a "
      "free mesh dim -> all grads the same; unread grad inputs are asked for their forward layout",
      group_forward, group_reverse, group_grad);
  return r;
}

}  // namespace shardwise::ops
