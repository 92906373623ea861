// SPMD rules of the indexing ops: index_select, gather, scatter_add (this file), embedding and
// index_put (rules_embedding.cc).
//
// The indexed axis of the tensor an index points into is always Replicate (a local index refers
// to global positions). Index tensors are never Partial (a Partial index is resharded to R).
// Letters ('a' + dim) are merged with spmd::merge_axes: the first tensor sharding a letter wins,
// a mesh dim shards one letter; "sharding beats Partial": a Partial input on a mesh dim that
// shards some letter is resharded to Replicate there.
//
// index_select(x, index [k]; axis): x's letters except axis ('1', never sharded); index carries
//  the output's axis letter, so a sharded index gives an output sharded on axis the same way
//  (each rank selects its slice of indices). Merge order x, index. On a mesh dim no letter shards,
//  a Partial x of ANY op passes to the output (selection copies values: the selection of a
//  sum / avg / max / min of parts is the sum / avg / max / min of the selections).
//  grad (x, index, out, dout -> dx, -): merge x, index, dout; dx like x (axis R) plus Partial(sum)
//  on the mesh dims sharding index (each rank adds only its rows); dout's P(sum|avg) on a free
//  mesh dim passes to dx, its P(max|min) is resharded to R. x's values are not read: its given
//  Partials are kept where it is otherwise R; out is not read: it keeps its distribution.
//
// gather(x, index; axis): out has index's letters. A dim d != axis shares its letter between x,
//  index and out only when x and index have the same extent there (else the two tensors' chunks
//  would not line up): otherwise both are '1' (Replicate). x's axis is '1'; index's axis letter
//  may be sharded (the output follows). Merge order x, index. A Partial x of any op passes on a
//  free mesh dim (copying, as for index_select).
//  grad (x, index, out, dout -> dx, -): as index_select: dx Partial(sum) on the mesh dims sharding
//  index's axis letter; dout's P(sum|avg) passes; x's Partials kept (not read), out unchanged.
//
// scatter_add(x, index, src; axis): out has x's letters. A dim d != axis shares its letter among
//  x, index, src and out only when all three have the same extent there, else it is '1'; the axis
//  is '1' in all three. Merge order x, index, src. Partial on a free mesh dim: x and src both
//  P(sum), or both P(avg), pass to the output (out = x + scatter(src) is linear in both jointly);
//  any other Partial (incl. P(sum) with R: the R operand would count once per rank) -> R.
//  grad (x, index, src, out, dout -> dx, -, dsrc): merge x, index, src, dout (dout has x's
//  letters); dx = dout and dsrc = gather(dout, index): both take dout's layout on their letters
//  and dout's Partial of ANY op on a free mesh dim (both copy dout's values). x and src are not
//  read (their Partials are kept), out unchanged.
//
// Reverse (all): the wanted output's shardings map back through the letters (a letter an input
// lacks: R there); a wanted Partial becomes that Partial on the input that carries it through
// (index_select / gather: x, any op; scatter_add: x and src, sum or avg only; others -> R); the
// forward rule then returns the consistent pair.
#include "shardwise/core/error.h"
#include "shardwise/ops/index/rules.h"
#include "shardwise/ops/index/rules.h"
#include "shardwise/ops/index/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

using namespace index_detail;

// ---- index_select --------------------------------------------------------------------------------

struct SelectLabels {
  Notation x, index, out;
};

SelectLabels select_labels(const TensorSpec& x, const TensorSpec& index, const Attrs& attrs) {
  int a = check_index_select_shapes(x.shape, index.shape, attrs.get_int("axis", 0));
  SelectLabels l;
  for (int d = 0; d < x.shape.ndim(); ++d) {
    l.x.push(d == a ? '1' : letter(d));
    l.out.push(letter(d));
  }
  l.index.push(letter(a));
  return l;
}

// Forward of the copying ops (index_select, gather): x, index merged; x's Partial of any op passes
// on the mesh dims no letter shards.
SpmdResult copy_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Notation& x,
                        const Notation& index, const Notation& out) {
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({x.view(), index.view()}, {in[0].dist, in[1].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(x.view(), axes, md), dist_from_axes(index.view(), axes, md)};
  r.outputs = {dist_from_axes(out.view(), axes, md)};
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& p = in[0].dist[m];
    if ((claimed & (1u << m)) || !p.is_partial()) continue;
    r.inputs[0].set(m, p);
    r.outputs[0].set(m, p);
  }
  return r;
}

// Reverse of the copying ops: the wanted output's shardings and Partials go to x / index.
SpmdResult copy_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, const TensorSpec& want,
                        const Notation& x, const Notation& index, const Notation& out) {
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({out.view()}, {want.dist});
  std::array<TensorSpec, 2> given = {in[0], in[1]};
  given[0].dist = dist_from_axes(x.view(), axes, md);
  given[1].dist = dist_from_axes(index.view(), axes, md);
  for (int m = 0; m < md; ++m) {
    if (want.dist[m].is_partial()) given[0].dist.set(m, want.dist[m]);
  }
  return copy_forward(mesh, given, x, index, out);
}

// Grad of the copying ops (x, index, out, dout -> dx, -): dx is Partial(sum) on the mesh dims
// sharding a letter of index that x lacks (each rank scatters only its part of the indices).
SpmdResult copy_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Notation& x,
                     const Notation& index, const Notation& out) {
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({x.view(), index.view(), out.view()}, {g[0].dist, g[1].dist, g[3].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(x.view(), axes, md), dist_from_axes(index.view(), axes, md), g[2].dist,
              dist_from_axes(out.view(), axes, md)};
  keep_unread_partials(r.inputs[0], g[0].dist);
  DistAttr dx = dist_from_axes(x.view(), axes, md);
  partial_for_missing(dx, index.view(), x, axes);
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& p = g[3].dist[m];
    if ((claimed & (1u << m)) || !is_linear_partial(p)) continue;
    r.inputs[3].set(m, p);
    dx.set(m, p);
  }
  r.outputs = {dx, DistAttr(md)};
  return r;
}

void check_out(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> out, const Shape& expected) {
  check_inputs(rule, mesh, out, 1);
  SW_CHECK(out[0].shape == expected, "rule '{}': the output has shape {}, expected {}", rule,
           out[0].shape.to_string(), expected.to_string());
}

SpmdResult index_select_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("index_select", mesh, in, 2);
  SelectLabels l = select_labels(in[0], in[1], attrs);
  return copy_forward(mesh, in, l.x, l.index, l.out);
}

SpmdResult index_select_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in,
                                std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs("index_select", mesh, in, 2);
  SelectLabels l = select_labels(in[0], in[1], attrs);
  check_out("index_select", mesh, out, index_select_shape(in[0].shape, in[1].shape, attrs.get_int("axis", 0)));
  return copy_reverse(mesh, in, out[0], l.x, l.index, l.out);
}

SpmdResult index_select_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs("index_select grad", mesh, g, 4);
  SelectLabels l = select_labels(g[0], g[1], attrs);
  Shape out = index_select_shape(g[0].shape, g[1].shape, attrs.get_int("axis", 0));
  SW_CHECK(g[2].shape == out && g[3].shape == out,
           "index_select grad: out {} and dout {} must have the output shape {}", g[2].shape.to_string(),
           g[3].shape.to_string(), out.to_string());
  return copy_grad(mesh, g, l.x, l.index, l.out);
}

// ---- gather ---------------------------------------------------------------------------------------

struct GatherLabels {
  Notation x, index;  // the output has index's labels
};

GatherLabels gather_labels(const TensorSpec& x, const TensorSpec& index, const Attrs& attrs) {
  int a = check_gather_shapes(x.shape, index.shape, attrs.get_int("axis", 0));
  GatherLabels l;
  for (int d = 0; d < x.shape.ndim(); ++d) {
    if (d == a) {
      l.x.push('1');
      l.index.push(letter(d));
    } else {
      char c = x.shape[d] == index.shape[d] ? letter(d) : '1';
      l.x.push(c);
      l.index.push(c);
    }
  }
  return l;
}

SpmdResult gather_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("gather", mesh, in, 2);
  GatherLabels l = gather_labels(in[0], in[1], attrs);
  return copy_forward(mesh, in, l.x, l.index, l.index);
}

SpmdResult gather_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                          const Attrs& attrs) {
  check_inputs("gather", mesh, in, 2);
  GatherLabels l = gather_labels(in[0], in[1], attrs);
  check_out("gather", mesh, out, in[1].shape);
  return copy_reverse(mesh, in, out[0], l.x, l.index, l.index);
}

SpmdResult gather_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs("gather grad", mesh, g, 4);
  GatherLabels l = gather_labels(g[0], g[1], attrs);
  SW_CHECK(g[2].shape == g[1].shape && g[3].shape == g[1].shape,
           "gather grad: out {} and dout {} must have index's shape {}", g[2].shape.to_string(),
           g[3].shape.to_string(), g[1].shape.to_string());
  return copy_grad(mesh, g, l.x, l.index, l.index);
}

// ---- scatter_add ----------------------------------------------------------------------------------

struct ScatterLabels {
  Notation x, index, src;  // the output has x's labels
};

ScatterLabels scatter_labels(const TensorSpec& x, const TensorSpec& index, const TensorSpec& src,
                             const Attrs& attrs) {
  int a = check_scatter_add_shapes(x.shape, index.shape, src.shape, attrs.get_int("axis", 0));
  ScatterLabels l;
  for (int d = 0; d < x.shape.ndim(); ++d) {
    bool shared = d != a && x.shape[d] == index.shape[d] && x.shape[d] == src.shape[d];
    char c = shared ? letter(d) : '1';
    l.x.push(c);
    l.index.push(c);
    l.src.push(c);
  }
  return l;
}

SpmdResult scatter_forward_with(const ProcessMesh& mesh, std::span<const TensorSpec> in, const ScatterLabels& l) {
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({l.x.view(), l.index.view(), l.src.view()}, {in[0].dist, in[1].dist, in[2].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(l.x.view(), axes, md), dist_from_axes(l.index.view(), axes, md),
              dist_from_axes(l.src.view(), axes, md)};
  r.outputs = {dist_from_axes(l.x.view(), axes, md)};
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& px = in[0].dist[m];
    if ((claimed & (1u << m)) || !is_linear_partial(px) || !(in[2].dist[m] == px)) continue;
    r.inputs[0].set(m, px);
    r.inputs[2].set(m, px);
    r.outputs[0].set(m, px);
  }
  return r;
}

SpmdResult scatter_add_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("scatter_add", mesh, in, 3);
  return scatter_forward_with(mesh, in, scatter_labels(in[0], in[1], in[2], attrs));
}

SpmdResult scatter_add_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in,
                               std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs("scatter_add", mesh, in, 3);
  ScatterLabels l = scatter_labels(in[0], in[1], in[2], attrs);
  check_out("scatter_add", mesh, out, in[0].shape);
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({l.x.view()}, {out[0].dist});
  std::array<TensorSpec, 3> given = {in[0], in[1], in[2]};
  given[0].dist = dist_from_axes(l.x.view(), axes, md);
  given[1].dist = dist_from_axes(l.index.view(), axes, md);
  given[2].dist = dist_from_axes(l.src.view(), axes, md);
  for (int m = 0; m < md; ++m) {
    const Placement& p = out[0].dist[m];
    if (!is_linear_partial(p)) continue;
    given[0].dist.set(m, p);
    given[2].dist.set(m, p);
  }
  return scatter_forward_with(mesh, given, l);
}

SpmdResult scatter_add_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs("scatter_add grad", mesh, g, 5);
  ScatterLabels l = scatter_labels(g[0], g[1], g[2], attrs);
  SW_CHECK(g[3].shape == g[0].shape && g[4].shape == g[0].shape,
           "scatter_add grad: out {} and dout {} must have x's shape {}", g[3].shape.to_string(),
           g[4].shape.to_string(), g[0].shape.to_string());
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({l.x.view(), l.index.view(), l.src.view(), l.x.view()},
                            {g[0].dist, g[1].dist, g[2].dist, g[4].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(l.x.view(), axes, md), dist_from_axes(l.index.view(), axes, md),
              dist_from_axes(l.src.view(), axes, md), g[3].dist, dist_from_axes(l.x.view(), axes, md)};
  keep_unread_partials(r.inputs[0], g[0].dist);
  keep_unread_partials(r.inputs[2], g[2].dist);
  DistAttr dx = dist_from_axes(l.x.view(), axes, md);
  DistAttr dsrc = dist_from_axes(l.src.view(), axes, md);
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& p = g[4].dist[m];
    if ((claimed & (1u << m)) || !p.is_partial()) continue;
    r.inputs[4].set(m, p);
    dx.set(m, p);
    dsrc.set(m, p);
  }
  r.outputs = {dx, DistAttr(md), dsrc};
  return r;
}

}  // namespace

IndexRules index_rules() {
  IndexRules r;
  r.index_select = Rule{"index_select",
                    "x's axis R, other dims pass; index [k] may be sharded: out sharded on axis like index; Partial x "
                    "(any op) passes where no dim is sharded; index never Partial; grad: dx P(sum) where index is "
                    "sharded, dout P(sum|avg) passes",
                    index_select_forward, index_select_reverse, index_select_grad};
  r.gather = Rule{"gather",
                    "x's axis R; index's axis may be sharded (out follows); other dims shared by x and index only "
                    "when their extents are equal, else R; Partial x (any op) passes; grad: dx P(sum) where index's "
                    "axis is sharded, dout P(sum|avg) passes",
                    gather_forward, gather_reverse, gather_grad};
  r.scatter_add = Rule{"scatter_add",
                    "axis R in x, index, src; other dims shared only when the three extents are equal, else R; x "
                    "and src both P(sum) (or both P(avg)) -> out P(same), other Partials R; grad: dx = dout, dsrc = "
                    "gather(dout): both follow dout, any dout Partial passes",
                    scatter_add_forward, scatter_add_reverse, scatter_add_grad};
  r.embedding = index_detail::embedding_rule();
  r.index_put = index_detail::index_put_rule();
  return r;
}

}  // namespace shardwise::ops
