// SPMD rules of layer_norm and rms_norm.
//
// Notation: x is labelled "abc..": its leading dims [0, k) (k = begin_norm_axis) carry the row
// letters, its normalized dims [k, ndim) the normalized letters. scale and bias carry the
// normalized letters, out carries x's letters, the statistics (mean and rstd, or inv_rms) the row
// letters (they have shape x.shape[:k], so they map 1:1 onto x's leading dims).
//  forward: the row letters keep x's sharding (co-shard order included); the normalized letters
//    are Replicate (a row's statistics need the whole row); scale and bias are Replicate (they carry
//    only normalized letters); out is laid out like the required x and the statistics like x's
//    leading dims. Every Partial input is resharded to Replicate: the normalization is not linear
//    in x, and Partial scale / bias are not kept (P(avg) would pass, not worth a special case).
//  reverse: the row letters come from the wanted out, then the wanted statistics (in output order,
//    first sharding wins); wanted Partials and normalized-dim shards become Replicate; then forward.
//  grad (inputs x, scale, [bias,] out, stats.., dout, dstats..): the row letters merge from x,
//    dout, then the statistics (that order); the normalized letters are Replicate. Required: x and
//    dout on the merged row sharding, the statistics like x's leading dims, scale Replicate. bias,
//    out and the statistics' gradients are not read by the backward kernel (the latter are
//    ignored): they keep their given distribution, no reshard.
//    dx is laid out like x; dscale and dbias are Partial(sum) on every mesh dim that shards a row
//    letter (each rank sums over its own rows; an empty shard adds 0). A Partial dout is reduced
//    first (Replicate): passing it on would cost the same reduction of dx later plus one of
//    dscale and dbias each; reducing dout is where Megatron-LM places the all-reduce.
#include <array>

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
#include "shardwise/ops/norm/rules.h"
#include "shardwise/ops/norm/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

struct NormKind {
  const char* name;  // rule name (a literal), used in messages
  int params;        // scale (+ bias)
  int stats;         // mean, rstd / inv_rms
};
constexpr NormKind kLayerNorm{"layer_norm", 2, 2};
constexpr NormKind kRmsNorm{"rms_norm", 1, 1};

struct Labels {
  std::string_view x, rows, normed;
};

Labels label(const NormKind& kind, const TensorSpec& x, const Attrs& attrs) {
  int k = norm_begin_axis(attrs, x.shape.ndim(), kind.name);
  std::string_view letters = axis_letters(x.shape.ndim());
  return {letters, letters.substr(0, static_cast<size_t>(k)), letters.substr(static_cast<size_t>(k))};
}

// Error unless `t` has rank `rank` and x's extents at dims [from, from + rank).
void check_dims(const NormKind& kind, const char* what, const TensorSpec& t, const TensorSpec& x, int from, int rank) {
  bool ok = t.shape.ndim() == rank;
  for (int d = 0; ok && d < rank; ++d) ok = t.shape[d] == x.shape[from + d];
  SW_CHECK(ok, "{}: {} has shape {}, but for x {} (begin_norm_axis as given) it must be x.shape[{}:{}]", kind.name,
           what, t.shape.to_string(), x.shape.to_string(), from, from + rank);
}

void check_params(const NormKind& kind, std::span<const TensorSpec> in, const Labels& l) {
  static constexpr const char* kNames[2] = {"scale", "bias"};
  int k = static_cast<int>(l.rows.size());
  for (int p = 0; p < kind.params; ++p) {
    check_dims(kind, kNames[p], in[static_cast<size_t>(1 + p)], in[0], k, static_cast<int>(l.normed.size()));
  }
}

SpmdResult norm_forward(const NormKind& kind, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                        const Attrs& attrs) {
  check_inputs(kind.name, mesh, in, static_cast<size_t>(1 + kind.params));
  Labels l = label(kind, in[0], attrs);
  check_params(kind, in, l);
  int nd = mesh.ndim();
  AxisMap axes = merge_axes({l.x}, {in[0].dist}, l.normed);
  SpmdResult r;
  r.inputs.reserve(static_cast<size_t>(1 + kind.params));
  r.outputs.reserve(static_cast<size_t>(1 + kind.stats));
  r.inputs.push_back(dist_from_axes(l.x, axes, nd));
  for (int p = 0; p < kind.params; ++p) r.inputs.emplace_back(nd);
  r.outputs.push_back(r.inputs[0]);
  DistAttr stat = dist_from_axes(l.rows, axes, nd);
  for (int s = 0; s < kind.stats; ++s) r.outputs.push_back(stat);
  return r;
}

SpmdResult norm_reverse(const NormKind& kind, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                        std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs(kind.name, mesh, in, static_cast<size_t>(1 + kind.params));
  check_inputs(kind.name, mesh, out, static_cast<size_t>(1 + kind.stats));
  Labels l = label(kind, in[0], attrs);
  int k = static_cast<int>(l.rows.size());
  check_dims(kind, "out", out[0], in[0], 0, in[0].shape.ndim());
  for (int s = 0; s < kind.stats; ++s) {
    check_dims(kind, "a statistics output", out[static_cast<size_t>(1 + s)], in[0], 0, k);
  }
  std::array<std::string_view, 3> notations{l.x, l.rows, l.rows};
  std::array<DistAttr, 3> dists{};
  for (size_t o = 0; o < out.size(); ++o) dists[o] = out[o].dist;
  AxisMap axes = merge_axes(std::span<const std::string_view>(notations.data(), out.size()),
                            std::span<const DistAttr>(dists.data(), out.size()), l.normed);
  std::array<TensorSpec, 3> specs{};
  for (size_t i = 0; i < in.size(); ++i) specs[i] = {in[i].shape, in[i].dtype, DistAttr(mesh.ndim())};
  specs[0].dist = dist_from_axes(l.x, axes, mesh.ndim());
  return norm_forward(kind, mesh, std::span<const TensorSpec>(specs.data(), in.size()), attrs);
}

SpmdResult norm_grad(const NormKind& kind, const ProcessMesh& mesh, std::span<const TensorSpec> g,
                     const Attrs& attrs) {
  const auto params = static_cast<size_t>(kind.params), stats = static_cast<size_t>(kind.stats);
  const size_t out_i = 1 + params, stat_i = out_i + 1, dout_i = stat_i + stats;
  check_inputs(kind.name, mesh, g, dout_i + 1 + stats);
  Labels l = label(kind, g[0], attrs);
  check_params(kind, g, l);
  int k = static_cast<int>(l.rows.size());
  check_dims(kind, "dout", g[dout_i], g[0], 0, g[0].shape.ndim());
  for (size_t s = 0; s < stats; ++s) check_dims(kind, "a statistics output", g[stat_i + s], g[0], 0, k);
  int nd = mesh.ndim();
  std::array<std::string_view, 4> notations{l.x, l.x, l.rows, l.rows};
  std::array<DistAttr, 4> dists{g[0].dist, g[dout_i].dist, g[stat_i].dist,
                                stats > 1 ? g[stat_i + 1].dist : DistAttr(nd)};
  AxisMap axes = merge_axes(std::span<const std::string_view>(notations.data(), 2 + stats),
                            std::span<const DistAttr>(dists.data(), 2 + stats), l.normed);
  SpmdResult r;
  r.inputs.reserve(g.size());
  for (const TensorSpec& t : g) r.inputs.push_back(t.dist);  // unread inputs keep theirs
  DistAttr x = dist_from_axes(l.x, axes, nd);
  DistAttr stat = dist_from_axes(l.rows, axes, nd);
  r.inputs[0] = x;
  r.inputs[1] = DistAttr(nd);  // scale
  for (size_t s = 0; s < stats; ++s) r.inputs[stat_i + s] = stat;
  r.inputs[dout_i] = x;
  DistAttr dparam(nd);
  add_partial_for(dparam, l.rows, axes, ReduceOp::Sum);
  r.outputs.reserve(1 + params);
  r.outputs.push_back(x);
  for (size_t p = 0; p < params; ++p) r.outputs.push_back(dparam);
  return r;
}

Rule make_rule(const NormKind& kind, std::string summary) {
  return Rule{
      kind.name, std::move(summary),
      [&kind](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
        return norm_forward(kind, mesh, in, attrs);
      },
      [&kind](const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
              const Attrs& attrs) { return norm_reverse(kind, mesh, in, out, attrs); },
      [&kind](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
        return norm_grad(kind, mesh, in, attrs);
      }};
}

}  // namespace

NormRules norm_rules() {
  NormRules r;
  r.layer_norm = make_rule(kLayerNorm,
           "x's leading dims [0, k) keep their sharding, normalized dims [k, ndim) -> R, scale/bias -> R, every "
           "Partial -> R; out like x, mean/rstd like x's leading dims. Grad: x, dout, mean, rstd merged on the "
           "leading dims (normalized -> R, scale R); dx like x, dscale/dbias P(sum) on mesh dims sharding a leading "
           "dim; a Partial dout -> R first (as Megatron-LM reduces it), so dscale/dbias need no extra reduction");
  r.rms_norm = make_rule(kRmsNorm,
           "x's leading dims [0, k) keep their sharding, normalized dims [k, ndim) -> R, scale -> R, every Partial "
           "-> R; out like x, inv_rms like x's leading dims. Grad: x, dout, inv_rms merged on the leading dims "
           "(normalized -> R, scale R); dx like x, dscale P(sum) on mesh dims sharding a leading dim; a Partial "
           "dout -> R first (as Megatron-LM reduces it), so dscale needs no extra reduction");
  return r;
}

}  // namespace shardwise::ops
