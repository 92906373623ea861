// SPMD rules of the misc ops: dropout, cumsum, argmax / argmin (arg_reduce), topk.
//
// x is labelled "abc..", and the einsum helper (merge_axes / dist_from_axes) keeps every Shard
// it can; the letter of the op's axis (cumsum, arg_reduce, topk) is never sharded.
//  - dropout: every Shard passes: the mask is keyed by the GLOBAL element index (the kernel reads
//    its block's offset from the KernelContext), so every shard draws exactly the single-device
//    mask. out = x * c with c = mask / (1 - p) >= 0 fixed per element, so every Partial of x
//    passes to out (linear: sum, avg; non-decreasing: max, min). The mask follows x's shards and
//    is Replicate where x is Partial (every rank of that mesh dim draws the same mask).
//    Grad (x, out, mask, dout, dmask -> dx): dx = dout * c, linear and non-decreasing in dout:
//    x, dout, mask merged in that order (dx follows x's sharding); on a mesh dim no letter
//    shards, every Partial of dout passes to dx (mask R there). x and out are not read: left as
//    given. dmask (the grad of an integer output, which no real program produces) is ignored and
//    reported laid out like the mask.
//  - cumsum: the cumsum axis -> R (a prefix sum needs the whole axis); other dims pass; P(sum),
//    P(avg) pass (linear); P(max), P(min) -> R. Grad (x, out, dout -> dx): dx = reverse cumsum of
//    dout: x, dout merged with the axis R, dout's P(sum|avg) passes on free mesh dims; x and out
//    are not read: left as given.
//  - arg_reduce (argmax, argmin): the reduced axis -> R (local indices are not global indices and
//    there is no Partial(argmax)); other dims pass, renumbered like a reduction (keepdim: '1' in
//    place of the axis); every Partial -> R. No gradient: the grad rule leaves its inputs as given
//    and reports dx as R.
//  - topk: the topk axis -> R; other dims pass; values and indices take x's sharding; every
//    Partial -> R. Grad (x, values, indices, dvalues, dindices -> dx): dx = zeros with dvalues
//    scattered at indices: x (its local shape sizes dx), indices and dvalues are merged in that
//    order with the axis R; on a mesh dim no letter shards, every Partial of dvalues passes to dx
//    (each element of dx is one dvalue or a constant 0 on every rank), and x's Partial is kept
//    (its values are not read); values is not read: left as given; dindices (the grad of an
//    integer output) is ignored and reported laid out like indices.
// Reverse rules: the wanted outputs (first output first) are merged into x's layout, wanted
// Partials kept only where the op makes them (dropout: out's Partial), then the forward rule
// returns the consistent pair.
#include <array>

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
#include "shardwise/ops/misc/rules.h"
#include "shardwise/ops/misc/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// Output labels of a reduction over one axis (no allocation).
struct ReducedLabels {
  std::array<char, kMaxDims> buf{};
  int n = 0;
  ReducedLabels(int ndim, int axis, bool keepdim) {
    for (int d = 0; d < ndim; ++d) {
      if (d != axis) {
        buf[static_cast<size_t>(n++)] = static_cast<char>('a' + d);
      } else if (keepdim) {
        buf[static_cast<size_t>(n++)] = '1';
      }
    }
  }
  std::string_view view() const { return {buf.data(), static_cast<size_t>(n)}; }
};

void check_same_rank(std::string_view rule, const TensorSpec& t, int ndim, std::string_view what) {
  SW_CHECK(t.shape.ndim() == ndim, "rule '{}': {} has rank {}, expected {}", rule, what, t.shape.ndim(), ndim);
}

bool is_linear(const Placement& p) {
  return p.is_partial(ReduceOp::Sum) || p.is_partial(ReduceOp::Avg);
}

// ---- dropout ----

SpmdResult dropout_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs&) {
  check_inputs("dropout", mesh, in, 1);
  DistAttr mask = in[0].dist;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (mask[m].is_partial()) mask.set(m, Placement::replicate());
  }
  return {{in[0].dist}, {in[0].dist, mask}};
}

SpmdResult dropout_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                           const Attrs& attrs) {
  check_inputs("dropout", mesh, in, 1);
  check_inputs("dropout", mesh, out, 2);
  const int nd = in[0].shape.ndim();
  check_same_rank("dropout", out[0], nd, "out");
  check_same_rank("dropout", out[1], nd, "mask");
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l, l}, {out[0].dist, out[1].dist});
  DistAttr xd = dist_from_axes(l, axes, mesh.ndim());
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (axes.letter_of(m) == 0 && out[0].dist[m].is_partial()) xd.set(m, out[0].dist[m]);
  }
  TensorSpec spec{in[0].shape, in[0].dtype, xd};
  return dropout_forward(mesh, std::span<const TensorSpec>(&spec, 1), attrs);
}

SpmdResult dropout_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
  check_inputs("dropout", mesh, g, 5);
  const int nd = g[0].shape.ndim();
  for (size_t i = 1; i < 5; ++i) check_same_rank("dropout", g[i], nd, "a grad input");
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l, l, l}, {g[0].dist, g[3].dist, g[2].dist});
  DistAttr sharded = dist_from_axes(l, axes, mesh.ndim());
  DistAttr dy = sharded;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (axes.letter_of(m) == 0 && g[3].dist[m].is_partial()) dy.set(m, g[3].dist[m]);
  }
  return {{g[0].dist, g[1].dist, sharded, dy, sharded}, {dy}};
}

// ---- cumsum ----

SpmdResult cumsum_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("cumsum", mesh, in, 1);
  const int nd = in[0].shape.ndim();
  const char axis_letter = static_cast<char>('a' + misc_axis(attrs, nd, "cumsum", std::nullopt));
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l}, {in[0].dist}, std::string_view(&axis_letter, 1));
  DistAttr d = dist_from_axes(l, axes, mesh.ndim());
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (is_linear(in[0].dist[m])) d.set(m, in[0].dist[m]);
  }
  return {{d}, {d}};
}

SpmdResult cumsum_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                          const Attrs& attrs) {
  check_inputs("cumsum", mesh, in, 1);
  check_inputs("cumsum", mesh, out, 1);
  check_same_rank("cumsum", out[0], in[0].shape.ndim(), "the output");
  // The output has x's labels and x's Partials: the wanted layout, made feasible, is x's.
  TensorSpec spec{in[0].shape, in[0].dtype, out[0].dist};
  return cumsum_forward(mesh, std::span<const TensorSpec>(&spec, 1), attrs);
}

SpmdResult cumsum_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs("cumsum", mesh, g, 3);
  const int nd = g[0].shape.ndim();
  check_same_rank("cumsum", g[1], nd, "out");
  check_same_rank("cumsum", g[2], nd, "dout");
  const char axis_letter = static_cast<char>('a' + misc_axis(attrs, nd, "cumsum", std::nullopt));
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l, l}, {g[0].dist, g[2].dist}, std::string_view(&axis_letter, 1));
  DistAttr dy = dist_from_axes(l, axes, mesh.ndim());
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (axes.letter_of(m) == 0 && is_linear(g[2].dist[m])) dy.set(m, g[2].dist[m]);
  }
  return {{g[0].dist, g[1].dist, dy}, {dy}};
}

// ---- argmax / argmin ----

SpmdResult arg_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("arg_reduce", mesh, in, 1);
  const int nd = in[0].shape.ndim();
  const int axis = misc_axis(attrs, nd, "arg_reduce", std::nullopt);
  const char axis_letter = static_cast<char>('a' + axis);
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l}, {in[0].dist}, std::string_view(&axis_letter, 1));
  ReducedLabels out(nd, axis, attrs.get_bool("keepdim", false));
  return {{dist_from_axes(l, axes, mesh.ndim())}, {dist_from_axes(out.view(), axes, mesh.ndim())}};
}

SpmdResult arg_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                       const Attrs& attrs) {
  check_inputs("arg_reduce", mesh, in, 1);
  check_inputs("arg_reduce", mesh, out, 1);
  const int nd = in[0].shape.ndim();
  const int axis = misc_axis(attrs, nd, "arg_reduce", std::nullopt);
  const bool keepdim = attrs.get_bool("keepdim", false);
  ReducedLabels labels(nd, axis, keepdim);
  check_same_rank("arg_reduce", out[0], labels.n, "the output");
  DistAttr xd(mesh.ndim());
  for (int d = 0, j = 0; d < nd; ++d) {
    if (d == axis) {
      if (keepdim) ++j;
      continue;
    }
    MeshDimList dims = out[0].dist.mesh_dims_of(j++);
    if (!dims.empty()) xd.set_shard_order(d, dims);
  }
  TensorSpec spec{in[0].shape, in[0].dtype, xd};
  return arg_forward(mesh, std::span<const TensorSpec>(&spec, 1), attrs);
}

SpmdResult arg_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
  check_inputs("arg_reduce", mesh, g, 3);
  return {{g[0].dist, g[1].dist, g[2].dist}, {DistAttr(mesh.ndim())}};
}

// ---- topk ----

SpmdResult topk_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("topk", mesh, in, 1);
  const int nd = in[0].shape.ndim();
  const char axis_letter = static_cast<char>('a' + misc_axis(attrs, nd, "topk", -1));
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l}, {in[0].dist}, std::string_view(&axis_letter, 1));
  DistAttr d = dist_from_axes(l, axes, mesh.ndim());
  return {{d}, {d, d}};
}

SpmdResult topk_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                        const Attrs& attrs) {
  check_inputs("topk", mesh, in, 1);
  check_inputs("topk", mesh, out, 2);
  const int nd = in[0].shape.ndim();
  check_same_rank("topk", out[0], nd, "values");
  check_same_rank("topk", out[1], nd, "indices");
  const char axis_letter = static_cast<char>('a' + misc_axis(attrs, nd, "topk", -1));
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l, l}, {out[0].dist, out[1].dist}, std::string_view(&axis_letter, 1));
  TensorSpec spec{in[0].shape, in[0].dtype, dist_from_axes(l, axes, mesh.ndim())};
  return topk_forward(mesh, std::span<const TensorSpec>(&spec, 1), attrs);
}

SpmdResult topk_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs("topk", mesh, g, 5);
  const int nd = g[0].shape.ndim();
  for (size_t i = 1; i < 5; ++i) check_same_rank("topk", g[i], nd, "a grad input");
  const char axis_letter = static_cast<char>('a' + misc_axis(attrs, nd, "topk", -1));
  std::string_view l = axis_letters(nd);
  AxisMap axes = merge_axes({l, l, l}, {g[0].dist, g[2].dist, g[3].dist}, std::string_view(&axis_letter, 1));
  DistAttr sharded = dist_from_axes(l, axes, mesh.ndim());
  DistAttr x = sharded, dv = sharded;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (axes.letter_of(m) != 0) continue;
    if (g[0].dist[m].is_partial()) x.set(m, g[0].dist[m]);
    if (g[3].dist[m].is_partial()) dv.set(m, g[3].dist[m]);
  }
  return {{x, g[1].dist, sharded, dv, sharded}, {dv}};
}

}  // namespace

MiscRules misc_rules() {
  MiscRules r;
  r.dropout = Rule{"dropout",
                    "every Shard passes (the mask is keyed by the global element index); every Partial of x "
                    "passes to out (out = x * c, c >= 0 per element); mask follows x's shards, R where x is "
                    "Partial. grad: x, dout, mask merged; dout's every Partial passes to dx on free mesh dims",
                    dropout_forward, dropout_reverse, dropout_grad};
  r.cumsum = Rule{"cumsum",
                    "the cumsum axis -> R; other dims pass; P(sum|avg) pass (linear), P(max|min) -> R. grad: "
                    "dx = reverse cumsum(dout), axis R, dout's P(sum|avg) passes",
                    cumsum_forward, cumsum_reverse, cumsum_grad};
  r.arg_reduce = Rule{"arg_reduce",
                    "argmax/argmin: the reduced axis -> R (local indices are not global); other dims pass "
                    "(renumbered, keepdim '1'); every Partial -> R; no gradient (dx reported R)",
                    arg_forward, arg_reverse, arg_grad};
  r.topk = Rule{"topk",
                    "the topk axis -> R; other dims pass; values and indices sharded like x; every Partial -> "
                    "R. grad: x, indices, dvalues merged (axis R); dvalues' every Partial passes to dx",
                    topk_forward, topk_reverse, topk_grad};
  return r;
}

}  // namespace shardwise::ops
