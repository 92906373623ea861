// SPMD rules of embedding and index_put (the other indexing rules are in index.cc).
//
// embedding(ids [...], weight [V, H]) -> out [..., H]. Labels: ids 'a', 'b', ..; weight "wh"
//  ('w' = vocab, 'h' = hidden); out = ids' letters ++ 'h'. Merge order weight, then ids (the
//  weight is the large tensor: on a conflict the ids are resharded, not the weight).
//  - ids sharded on a dim: the output is sharded on that dim (H comes from the weight).
//  - weight sharded on H: the output is sharded on its last dim.
//  - weight sharded on V (vocab-parallel, Megatron-style): each rank holds rows [v0, v0 + V_local)
//    and outputs the rows of the ids in its range and ZEROS for the others, so the output is
//    Partial(sum) on those mesh dims (uneven and empty vocab shards included).
//  - weight Partial of ANY op on a free mesh dim passes to the output (embedding copies rows: the
//    rows of a sum / avg / max / min of parts are the sum / avg / max / min of the rows).
//  - ids are never Partial (resharded to R).
//  grad (ids, weight, out, dout -> -, dweight): merge weight, ids, dout (dout has out's letters);
//  dweight is laid out like the weight on 'w' / 'h', and Partial(sum) on the mesh dims sharding
//  an ids letter (each rank accumulates only its ids); dout's P(sum|avg) on a free mesh dim passes
//  to dweight, P(max|min) -> R. The weight's values are not read (its Partials are kept), out is
//  not read (unchanged).
//  reverse: ids and 'h' shardings map back; a wanted Partial(sum) becomes a vocab shard of the
//  weight on that mesh dim (co-sharded in mesh-dim order), a wanted P(avg|max|min) a Partial
//  weight.
//
// index_put(x, indices_1..indices_k, value; accumulate). Labels: x's first k (indexed) dims '1'
//  (Replicate), its trailing dims 'a' + d; every index tensor all '1' (Replicate: each rank needs
//  every index); value aligned to the right against B ++ x.shape[k:] (B = broadcast index
//  shape): a dim facing a trailing dim of x with the same extent takes x's letter, every other
//  dim (facing B, or broadcast from 1) is '1'. out has x's letters. Merge order x, value.
//  So the trailing dims of x may stay sharded, value sharded the SAME way on them.
//  Partial on a free mesh dim:
//   accumulate = true:  x and value both P(sum), or both P(avg) -> out P(same) (out = x + scatter
//     (value) is linear in both jointly); any other Partial -> R (P(sum) with R is not exact).
//   accumulate = false: x and value with the same Partial (any op) -> kept (each output element is
//     either x's or value's, per position); else a P(max|min) x with value R -> kept (x first),
//     else a P(max|min) value with x R -> kept; anything else R.
//  grad (x, indices.., value, out, dout -> dx, -.., dvalue): merge x, value, dout (dout has x's
//  letters). dx is laid out like x; dvalue like value plus Partial(sum) on the mesh dims sharding
//  a trailing letter value does not carry (its gradient sums over that broadcast dim, and each
//  rank sums only its block). dout's P(sum|avg) on a free mesh dim passes to both gradients,
//  P(max|min) -> R. x's and value's values are not read (their Partials are kept), out unchanged.
//  reverse: the wanted output's trailing shardings map to x and value; a wanted Partial becomes
//  that Partial on x and value where it can be produced (accumulate: sum/avg; assign: any op).
#include "shardwise/core/error.h"
#include "shardwise/ops/index/rules.h"
#include "shardwise/ops/index/kernels.h"

namespace shardwise::ops::index_detail {
using namespace spmd;

namespace {

// ---- embedding ------------------------------------------------------------------------------------

constexpr char kVocab = 'w';

struct EmbeddingLabels {
  Notation ids, weight, out;
};

EmbeddingLabels embedding_labels(const TensorSpec& ids, const TensorSpec& weight) {
  embedding_shape(ids.shape, weight.shape);  // validates (rank of weight, of the output)
  EmbeddingLabels l;
  const int r = ids.shape.ndim();
  for (int d = 0; d < r; ++d) {
    l.ids.push(letter(d));
    l.out.push(letter(d));
  }
  l.out.push(letter(r));  // r < kMaxDims <= 8: 'a'..'h', never the vocab letter 'w'
  l.weight.push(kVocab);
  l.weight.push(letter(r));
  return l;
}

SpmdResult embedding_forward_with(const ProcessMesh& mesh, std::span<const TensorSpec> in, const EmbeddingLabels& l) {
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({l.weight.view(), l.ids.view()}, {in[1].dist, in[0].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(l.ids.view(), axes, md), dist_from_axes(l.weight.view(), axes, md)};
  r.outputs = {dist_from_axes(l.out.view(), axes, md)};
  add_partial_for(r.outputs[0], std::string_view(&kVocab, 1), axes, ReduceOp::Sum);
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& p = in[1].dist[m];
    if ((claimed & (1u << m)) || !p.is_partial()) continue;
    r.inputs[1].set(m, p);
    r.outputs[0].set(m, p);
  }
  return r;
}

SpmdResult embedding_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs&) {
  check_inputs("embedding", mesh, in, 2);
  return embedding_forward_with(mesh, in, embedding_labels(in[0], in[1]));
}

SpmdResult embedding_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                             const Attrs&) {
  check_inputs("embedding", mesh, in, 2);
  EmbeddingLabels l = embedding_labels(in[0], in[1]);
  check_inputs("embedding (outputs)", mesh, out, 1);
  Shape expected = embedding_shape(in[0].shape, in[1].shape);
  SW_CHECK(out[0].shape == expected, "rule 'embedding': the output has shape {}, expected {}",
           out[0].shape.to_string(), expected.to_string());
  const int md = mesh.ndim();
  const DistAttr& want = out[0].dist;
  AxisMap axes = merge_axes({l.out.view()}, {want});
  for (int m = 0; m < md; ++m) {
    if (want[m].is_partial(ReduceOp::Sum)) axes[kVocab].push_back(m);
  }
  std::array<TensorSpec, 2> given = {in[0], in[1]};
  given[0].dist = dist_from_axes(l.ids.view(), axes, md);
  given[1].dist = dist_from_axes(l.weight.view(), axes, md);
  for (int m = 0; m < md; ++m) {
    if (want[m].is_partial() && !want[m].is_partial(ReduceOp::Sum)) given[1].dist.set(m, want[m]);
  }
  return embedding_forward_with(mesh, given, l);
}

SpmdResult embedding_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
  check_inputs("embedding grad", mesh, g, 4);
  EmbeddingLabels l = embedding_labels(g[0], g[1]);
  Shape expected = embedding_shape(g[0].shape, g[1].shape);
  SW_CHECK(g[2].shape == expected && g[3].shape == expected,
           "embedding grad: out {} and dout {} must have the output shape {}", g[2].shape.to_string(),
           g[3].shape.to_string(), expected.to_string());
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({l.weight.view(), l.ids.view(), l.out.view()}, {g[1].dist, g[0].dist, g[3].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(l.ids.view(), axes, md), dist_from_axes(l.weight.view(), axes, md), g[2].dist,
              dist_from_axes(l.out.view(), axes, md)};
  keep_unread_partials(r.inputs[1], g[1].dist);
  DistAttr dweight = dist_from_axes(l.weight.view(), axes, md);
  partial_for_missing(dweight, l.ids.view(), l.weight, axes);
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& p = g[3].dist[m];
    if ((claimed & (1u << m)) || !is_linear_partial(p)) continue;
    r.inputs[3].set(m, p);
    dweight.set(m, p);
  }
  r.outputs = {DistAttr(md), dweight};
  return r;
}

// ---- index_put ------------------------------------------------------------------------------------

struct PutLabels {
  Notation x, value;  // every index tensor is all '1'; out has x's letters
  int k = 0;
};

// inputs: x, indices (k = inputs.size() - 2), value.
PutLabels put_labels(std::span<const TensorSpec> in) {
  SW_CHECK(in.size() >= 3 && in.size() - 2 <= static_cast<size_t>(in[0].shape.ndim()),
           "index_put takes x, 1..rank(x) index tensors and value; got {} tensors for x of shape {}", in.size(),
           in[0].shape.to_string());
  PutLabels l;
  l.k = static_cast<int>(in.size()) - 2;
  std::array<Shape, kMaxDims> index_shapes;
  for (int j = 0; j < l.k; ++j) index_shapes[static_cast<size_t>(j)] = in[static_cast<size_t>(j) + 1].shape;
  const Shape& x = in[0].shape;
  const Shape& value = in.back().shape;
  Shape b = index_put_index_shape(x, std::span<const Shape>(index_shapes.data(), static_cast<size_t>(l.k)), value);
  for (int d = 0; d < x.ndim(); ++d) l.x.push(d < l.k ? '1' : letter(d));
  const int full_ndim = b.ndim() + x.ndim() - l.k;
  for (int j = 0; j < value.ndim(); ++j) {
    int f = j + full_ndim - value.ndim();  // the dim of B ++ x.shape[k:] that value's dim j faces
    int d = f - b.ndim() + l.k;            // the dim of x it faces, when f is a trailing dim
    l.value.push(f >= b.ndim() && value[j] == x[d] ? letter(d) : '1');
  }
  return l;
}

bool monotone(const Placement& p) { return p.is_partial(ReduceOp::Max) || p.is_partial(ReduceOp::Min); }

SpmdResult put_forward_with(const ProcessMesh& mesh, std::span<const TensorSpec> in, const PutLabels& l,
                            bool accumulate) {
  const int md = mesh.ndim();
  const size_t v = in.size() - 1;
  AxisMap axes = merge_axes({l.x.view(), l.value.view()}, {in[0].dist, in[v].dist});
  SpmdResult r;
  r.inputs.reserve(in.size());
  r.inputs.push_back(dist_from_axes(l.x.view(), axes, md));
  for (int j = 0; j < l.k; ++j) r.inputs.emplace_back(md);
  r.inputs.push_back(dist_from_axes(l.value.view(), axes, md));
  r.outputs = {dist_from_axes(l.x.view(), axes, md)};
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    if (claimed & (1u << m)) continue;
    const Placement &px = in[0].dist[m], &pv = in[v].dist[m];
    bool keep_x = false, keep_v = false;
    if (accumulate) {
      keep_x = keep_v = is_linear_partial(px) && px == pv;
    } else if (px.is_partial() && px == pv) {
      keep_x = keep_v = true;
    } else if (monotone(px)) {
      keep_x = true;
    } else if (monotone(pv)) {
      keep_v = true;
    }
    if (keep_x) r.inputs[0].set(m, px), r.outputs[0].set(m, px);
    if (keep_v) r.inputs[v].set(m, pv), r.outputs[0].set(m, pv);
  }
  return r;
}

SpmdResult index_put_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("index_put", mesh, in, in.size());
  return put_forward_with(mesh, in, put_labels(in), attrs.get_bool("accumulate", false));
}

SpmdResult index_put_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                             const Attrs& attrs) {
  check_inputs("index_put", mesh, in, in.size());
  PutLabels l = put_labels(in);
  check_inputs("index_put (outputs)", mesh, out, 1);
  SW_CHECK(out[0].shape == in[0].shape, "rule 'index_put': the output has shape {}, expected x's shape {}",
           out[0].shape.to_string(), in[0].shape.to_string());
  const bool accumulate = attrs.get_bool("accumulate", false);
  const int md = mesh.ndim();
  AxisMap axes = merge_axes({l.x.view()}, {out[0].dist});
  std::array<TensorSpec, kMaxDims + 2> given;
  for (size_t i = 0; i < in.size(); ++i) {
    given[i] = in[i];
    given[i].dist = DistAttr(md);
  }
  const size_t v = in.size() - 1;
  given[0].dist = dist_from_axes(l.x.view(), axes, md);
  given[v].dist = dist_from_axes(l.value.view(), axes, md);
  for (int m = 0; m < md; ++m) {
    const Placement& p = out[0].dist[m];
    if (!p.is_partial() || (accumulate && !is_linear_partial(p))) continue;
    given[0].dist.set(m, p);
    given[v].dist.set(m, p);
  }
  return put_forward_with(mesh, std::span<const TensorSpec>(given.data(), in.size()), l, accumulate);
}

SpmdResult index_put_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  // g = x, indices.., value, out, dout
  SW_CHECK(g.size() >= 5, "index_put grad takes x, the indices, value, out and dout; got {} tensors", g.size());
  check_inputs("index_put grad", mesh, g, g.size());
  const size_t n = g.size() - 2;  // forward inputs
  PutLabels l = put_labels(g.subspan(0, n));
  SW_CHECK(g[n].shape == g[0].shape && g[n + 1].shape == g[0].shape,
           "index_put grad: out {} and dout {} must have x's shape {}", g[n].shape.to_string(),
           g[n + 1].shape.to_string(), g[0].shape.to_string());
  const int md = mesh.ndim();
  const size_t v = n - 1;
  AxisMap axes =
      merge_axes({l.x.view(), l.value.view(), l.x.view()}, {g[0].dist, g[v].dist, g[n + 1].dist});
  SpmdResult r;
  r.inputs.reserve(g.size());
  r.inputs.push_back(dist_from_axes(l.x.view(), axes, md));
  keep_unread_partials(r.inputs[0], g[0].dist);
  for (int j = 0; j < l.k; ++j) r.inputs.emplace_back(md);
  r.inputs.push_back(dist_from_axes(l.value.view(), axes, md));
  keep_unread_partials(r.inputs[v], g[v].dist);
  r.inputs.push_back(g[n].dist);
  r.inputs.push_back(dist_from_axes(l.x.view(), axes, md));
  r.outputs.reserve(n);
  r.outputs.push_back(dist_from_axes(l.x.view(), axes, md));
  for (int j = 0; j < l.k; ++j) r.outputs.emplace_back(md);
  DistAttr dvalue = dist_from_axes(l.value.view(), axes, md);
  partial_for_missing(dvalue, l.x.view(), l.value, axes);
  r.outputs.push_back(dvalue);
  const uint32_t claimed = axes.claimed_mesh_dims();
  for (int m = 0; m < md; ++m) {
    const Placement& p = g[n + 1].dist[m];
    if ((claimed & (1u << m)) || !is_linear_partial(p)) continue;
    r.inputs[n + 1].set(m, p);
    r.outputs[0].set(m, p);
    r.outputs[v].set(m, p);
  }
  return r;
}

}  // namespace

Rule embedding_rule() {
  return Rule{"embedding",
              "weight [V,H] first, then ids: ids' sharded dims pass to out; weight S(H) -> out S(last); weight S(V) "
              "(vocab-parallel: rows outside the local range are zeros) -> out P(sum); weight Partial (any op) "
              "passes; ids never Partial; grad: dweight like weight, P(sum) where ids are sharded, dout P(sum|avg) "
              "passes",
              embedding_forward, embedding_reverse, embedding_grad};
}

Rule index_put_rule() {
  return Rule{"index_put",
              "x's k indexed dims R, trailing dims pass with value sharded the same way; indices R; accumulate: x "
              "and value both P(sum|avg) -> out P(same); assign: same Partial on both, or P(max|min) with R -> kept; "
              "grad: dx like x, dvalue like value plus P(sum) where its broadcast sum crosses a sharded dim, dout "
              "P(sum|avg) passes",
              index_put_forward, index_put_reverse, index_put_grad};
}

}  // namespace shardwise::ops::index_detail
