// SPMD rules of the reshape family (reshape, squeeze, unsqueeze, flatten) and of transpose.
//
// Reshape family — a dimension-transform analysis (as PaddlePaddle's reshape rule), shared by all
// four ops (each only computes its output shape differently). kernels.h
// reshape_transform cuts the input and output dims into groups of equal element count, left to
// right: equal extents pair 1:1; an unpaired extent-1 dim is a group of its own (a dim removed or
// a dim added); otherwise dims are taken on both sides until the products agree: a flatten
// (k -> 1), a split (1 -> k) or a general regroup (k -> m). Per group:
//  - 1:1: the input dim's sharding moves to the output dim unchanged (uneven and empty shards too);
//  - removed extent-1 input dim: Replicate (a "sharded" extent-1 dim leaves empty shards that do not
//    squeeze); added extent-1 output dim: Replicate. Extent-1 dims pair up 1:1 first, so squeezing
//    dim 0 of [1,1,5] pairs input dim 0 with output dim 0 (same data: which of two extent-1 dims
//    goes away does not matter) and a sharding of it is kept, consistently with the kernel;
//  - flatten / split / regroup: only the group's LEFTMOST input dim may stay sharded, and then on
//    the group's leftmost output dim, for the mesh dims (greedily, in split order) under which
//    both the input dim and that output dim split into EQUAL chunks (extents divisible by the
//    product of the kept mesh dims' sizes): then every rank's block is the same contiguous range
//    of the group's elements on both sides. Every other dim of the group, and the leftmost one's
//    other mesh dims, are resharded to Replicate. (Uneven chunk boundaries of a flattened dim do
//    not line up with chunks of the result.) Example: [1,512,4096] -> [1,2,256,4096] with 512 on
//    mesh [2] keeps S on the '2' dim; on mesh [3] (2 % 3 != 0) it is Replicate.
//    Except: a flatten (k -> 1) or split (1 -> k) whose leftmost dim is cut into single entries
//    (as many parts as entries) goes on to the next dim, and so on: a block [1, .., 1, k, n, .., n]
//    is still one contiguous range. A flatten [C, B, S'] with C on cp and B on dp is [C*B*S']
//    co-sharded (cp, dp); the split back gives C cp and B dp.
//  - Partial: every Partial passes unchanged (a reshape is elementwise-preserving).
// Reverse: the wanted output sharding is mapped back through the same groups (1:1 dims and the
// leftmost dims of groups), Partials copied, and the forward rule gives the consistent pair.
// Grad (x, out, dout -> dx): dx = dout reshaped back, so the forward rule runs on dout with the
// transform out -> x. x and out are not read (the kernel takes the global shapes from its context):
// they keep whatever distribution they have.
//
// Transpose: placements follow the permutation (output dim j takes input dim perm[j]'s mesh dims, in
// the same split order); nothing is resharded; Partials pass. Grad: dx = transpose(dout, inverse):
// dout's sharding maps back the same way; x and out untouched. Its three parts are derived by
// spmd/factor_rule.h from the description (x "abc..", the output x's letters permuted) and the
// rule "every Partial passes"; the reshape family is hand-written (its dim groups are not factors:
// a flattened group keeps only its leftmost dim's sharding, under equal chunks on both sides).
#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/ops/shape/rules.h"
#include "shardwise/ops/shape/kernels.h"

namespace shardwise::ops::shape_detail {
using namespace spmd;

namespace {

using OutShapeFn = Shape (*)(const Shape&, const Attrs&);

int64_t parts_of(const MeshDimList& dims, const ProcessMesh& mesh) {
  int64_t parts = 1;
  for (int8_t m : dims) parts *= mesh.dim_size(m);
  return parts;
}

// A flatten (k input dims -> 1): the leftmost input dim keeps the mesh dims under which it and the
// output split into equal chunks; while a dim's chunks are single entries (it is cut into as many
// parts as it has entries), the next dim's mesh dims are kept after them, as a rank's block is
// then still one contiguous range of the output ([C, B] with C on cp, B on dp: a rank holds one
// c and a chunk of B, the range c*B + chunk; co-shard order cp, dp). Everything else R.
void flatten_kept(const ProcessMesh& mesh, const TensorSpec& x, const DimGroup& g, int64_t out_extent, DistAttr& req,
                  DistAttr& out) {
  MeshDimList all;
  int64_t left = out_extent;
  for (int d = g.in_begin; d < g.in_end; ++d) {
    const MeshDimList kept = keep_even(x.dist.mesh_dims_of(d), x.shape[d], left, mesh);
    if (!kept.empty()) req.set_shard_order(d, kept);
    for (int8_t m : kept) all.push_back(m);
    const int64_t parts = parts_of(kept, mesh);
    if (parts != x.shape[d]) break;
    left /= parts;
  }
  if (!all.empty()) out.set_shard_order(g.out_begin, all);
}

// A split (1 input dim -> k): the leftmost output dim takes the input's mesh dims under which both
// split into equal chunks; while it is cut into single entries, the next output dim takes the
// remaining mesh dims that split it evenly, and so on (the inverse of flatten_kept). Input
// resharded to the kept mesh dims in that order.
void split_kept(const ProcessMesh& mesh, const TensorSpec& x, const DimGroup& g, const Shape& out_shape,
                DistAttr& req, DistAttr& out) {
  MeshDimList remaining = x.dist.mesh_dims_of(g.in_begin), all;
  int64_t left = x.shape[g.in_begin];
  for (int o = g.out_begin; o < g.out_end && !remaining.empty(); ++o) {
    const MeshDimList kept = keep_even(remaining, left, out_shape[o], mesh);
    if (!kept.empty()) out.set_shard_order(o, kept);
    MeshDimList rest;
    for (int8_t m : remaining) {
      if (!kept.contains(m)) rest.push_back(m);
    }
    remaining = rest;
    for (int8_t m : kept) all.push_back(m);
    const int64_t parts = parts_of(kept, mesh);
    if (parts != out_shape[o]) break;
    left /= parts;
  }
  if (!all.empty()) req.set_shard_order(g.in_begin, all);
}

// Forward of the reshape family for x (global `x.shape`) reshaped to `out_shape`.
SpmdResult reshape_forward(const ProcessMesh& mesh, const TensorSpec& x, const Shape& out_shape) {
  const DimTransform t = reshape_transform(x.shape, out_shape);
  const int md = mesh.ndim();
  DistAttr req(md), out(md);
  for (const DimGroup& g : t.view()) {
    if (g.in_count() == 0 || g.out_count() == 0) continue;
    if (g.in_count() > 1 && g.out_count() == 1) {
      flatten_kept(mesh, x, g, out_shape[g.out_begin], req, out);
      continue;
    }
    if (g.in_count() == 1 && g.out_count() > 1) {
      split_kept(mesh, x, g, out_shape, req, out);
      continue;
    }
    MeshDimList dims = x.dist.mesh_dims_of(g.in_begin);
    if (dims.empty()) continue;
    if (!g.one_to_one()) dims = keep_even(dims, x.shape[g.in_begin], out_shape[g.out_begin], mesh);
    if (dims.empty()) continue;
    req.set_shard_order(g.in_begin, dims);
    out.set_shard_order(g.out_begin, dims);
  }
  for (int m = 0; m < md; ++m) {
    if (x.dist[m].is_partial()) req.set(m, x.dist[m]), out.set(m, x.dist[m]);
  }
  SpmdResult r;
  r.inputs.push_back(req);
  r.outputs.push_back(out);
  return r;
}

struct ReshapeRule {
  std::string_view name;
  OutShapeFn out_shape;

  SpmdResult forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) const {
    check_inputs(name, mesh, in, 1);
    return reshape_forward(mesh, in[0], out_shape(in[0].shape, attrs));
  }

  SpmdResult reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                     const Attrs& attrs) const {
    check_inputs(name, mesh, in, 1);
    check_inputs(name, mesh, outs, 1);
    const Shape shape = out_shape(in[0].shape, attrs);
    check_shape(name, outs[0], shape, "the output");
    const DimTransform t = reshape_transform(in[0].shape, shape);
    const DistAttr& want = outs[0].dist;
    TensorSpec x{in[0].shape, in[0].dtype, DistAttr(mesh.ndim())};
    for (const DimGroup& g : t.view()) {
      if (g.in_count() == 0 || g.out_count() == 0) continue;
      MeshDimList dims = want.mesh_dims_of(g.out_begin);
      if (!dims.empty()) x.dist.set_shard_order(g.in_begin, dims);
    }
    for (int m = 0; m < mesh.ndim(); ++m) {
      if (want[m].is_partial()) x.dist.set(m, want[m]);
    }
    return reshape_forward(mesh, x, shape);
  }

  SpmdResult grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) const {
    check_inputs(name, mesh, g, 3);
    const Shape shape = out_shape(g[0].shape, attrs);
    check_shape(name, g[1], shape, "out");
    check_shape(name, g[2], shape, "dout");
    SpmdResult back = reshape_forward(mesh, g[2], g[0].shape);
    SpmdResult r;
    r.inputs.reserve(3);
    r.inputs.push_back(g[0].dist);
    r.inputs.push_back(g[1].dist);
    r.inputs.push_back(back.inputs[0]);
    r.outputs.push_back(back.outputs[0]);
    return r;
  }
};

Rule reshape_rule(std::string_view name, OutShapeFn out_shape, std::string summary) {
  ReshapeRule rule{name, out_shape};
  return Rule{std::string(name),
              std::move(summary),
              [rule](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
                return rule.forward(mesh, in, attrs);
              },
              [rule](const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                     const Attrs& attrs) { return rule.reverse(mesh, in, outs, attrs); },
              [rule](const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
                return rule.grad(mesh, g, attrs);
              }};
}

constexpr std::string_view kTranspose = "transpose";

// x "abc..", the output x's letters permuted (output dim j takes letter perm[j]).
Factors transpose_describe(std::span<const TensorSpec> in, const Attrs& attrs) {
  const Perm perm = transpose_perm(in[0].shape, attrs);
  Factors f;
  f.add_input(labels_of_rank(in[0].shape.ndim()));
  Labels out;
  for (int j = 0; j < perm.n; ++j) out.push(f.inputs[0].chars[static_cast<size_t>(perm.to[static_cast<size_t>(j)])]);
  f.add_output(out, transpose_shape(in[0].shape, perm));
  return f;
}

// Every Partial of operand `from` passes to result 0 (a permutation moves elements).
template <size_t from>
void pass_any_partial(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice) {
  if (!given[from].is_partial()) return;
  choice.operands[from] = given[from];
  choice.results[0] = given[from];
}

Rule transpose_rule(std::string summary) {
  FactorRule rule;
  rule.name = std::string(kTranspose);
  rule.summary = std::move(summary);
  rule.describe = transpose_describe;
  rule.forward_partials = pass_any_partial<0>;
  rule.reverse_partials = pass_any_partial<0>;
  rule.grad_partials = pass_any_partial<2>;  // dout's
  rule.grad_reads = 0;                       // x and out untouched
  return derive_rule(std::move(rule));
}

constexpr std::string_view kReshapeText =
    "dims grouped by equal element count: 1:1 dims keep their sharding (uneven too); a flatten/split/regroup keeps "
    "only its leftmost input dim's sharding, moved to its leftmost output dim, for the mesh dims under which both "
    "split into equal chunks, else R (a flatten/split goes on to the next dim while the dims before it are cut into "
    "single entries); removed/added extent-1 dims R; every Partial passes. Grad: the same on dout "
    "reshaped back; x, out untouched";

}  // namespace

void add_reshape_rules(ShapeRules& r) {
  r.reshape = reshape_rule("reshape", reshape_shape, "reshape: " + std::string(kReshapeText));
  r.squeeze = reshape_rule("squeeze", squeeze_shape, "squeeze (as reshape; dims renumbered): " + std::string(kReshapeText));
  r.unsqueeze = reshape_rule("unsqueeze", unsqueeze_shape,
                   "unsqueeze (as reshape; dims renumbered, new extent-1 dims R): " + std::string(kReshapeText));
  r.flatten = reshape_rule("flatten", flatten_shape,
                            "flatten (as reshape): the flattened range keeps its leftmost dim's sharding when its "
                            "chunks are equal, the other flattened dims R; " +
                                std::string(kReshapeText));
  r.transpose = transpose_rule(
                    "placements follow the permutation (output dim j takes input dim perm[j]'s mesh dims, same "
                    "split order); no reshard; every Partial passes. Grad: dout's sharding maps back through the "
                    "inverse permutation; x, out untouched");
}

}  // namespace shardwise::ops::shape_detail
