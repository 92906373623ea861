// SPMD rules of the shape ops: the helpers they share (rules.h), the rules of expand,
// slice and tile, and shape_rules() (the reshape family and transpose live in rules_reshape.cc,
// concat / stack / split in rules_join.cc).
//
// expand(x; shape): x dim d meets output dim d + lead (lead = new leading dims). A dim that maps
//   1:1 (equal extents, extent 1 included) keeps its sharding, uneven and empty shards too; a
//   broadcast dim (extent 1 repeated) is Replicate on x and on the output, as are the new leading
//   dims. Every Partial passes (each rank expands its part; expanding copies).
//   Grad (x, out, dout -> dx = dout summed over the broadcast and leading dims): dout keeps its
//   sharding everywhere; 1:1 dims pass to dx, a sharded summed dim makes dx P(sum) on its mesh dims
//   (each rank sums only its block). dout's P(sum)/P(avg) pass (the sum is linear); P(max)/P(min)
//   pass only when nothing is summed (every summed dim has extent <= 1), else Replicate.
// slice(x; axes, starts, ends): a cut dim (its range is not the whole extent) is Replicate — a
//   slice of a chunk layout is not a chunk layout; uncut dims (not listed, or listed with the whole
//   range) keep their sharding; every Partial passes. Grad (dx = dout pasted into zeros): dout's
//   cut dims Replicate, other dims and every Partial kept (the zeros reduce to zero under every
//   reduce op); dx alike.
// tile(x; repeat_times): a dim repeated (repeat != 1) is Replicate on x and the output (tiles of a
//   chunk are not chunks of the tiles); dims with repeat 1 keep their sharding; new leading dims R;
//   every Partial passes (tiling copies). Grad (dx = the tiles summed): dout's repeat-1 dims pass to
//   dx; a summed dim whose every element is a copy of one x element (a new leading dim, or a
//   repeated extent-1 dim) may stay sharded and makes dx P(sum) there; other repeated dims R. dout's
//   P(sum)/P(avg) pass; P(max)/P(min) only when no repeat exceeds 1.
// Reverse (all three): the wanted output sharding maps back through the same dim map (dims that
// cannot carry it dropped, Partials copied) and the forward rule gives the consistent pair.
// x and out are not read by the gradients (the kernels take the global shapes from their context):
// they keep whatever distribution they have.
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/shape/rules.h"
#include "shardwise/ops/shape/rules.h"
#include "shardwise/ops/shape/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace shape_detail {

DistAttr remap(const DistAttr& src, const DimMap& map) {
  DistAttr out(src.mesh_ndim());
  for (int d = 0; d < map.n; ++d) {
    int to = map.to[static_cast<size_t>(d)];
    if (to < 0) continue;
    MeshDimList dims = src.mesh_dims_of(d);
    if (!dims.empty()) out.set_shard_order(to, dims);
  }
  for (int m = 0; m < src.mesh_ndim(); ++m) {
    if (src[m].is_partial()) out.set(m, src[m]);
  }
  return out;
}

DistAttr keep_mapped(const DistAttr& src, const DimMap& map) {
  DimMap same;
  for (int d = 0; d < map.n; ++d) same.set(d, map.to[static_cast<size_t>(d)] < 0 ? -1 : d);
  return remap(src, same);
}

DistAttr drop_max_min(DistAttr dist) {
  for (int m = 0; m < dist.mesh_ndim(); ++m) {
    if (dist[m].is_partial(ReduceOp::Max) || dist[m].is_partial(ReduceOp::Min)) dist.set(m, Placement::replicate());
  }
  return dist;
}

MeshDimList keep_even(const MeshDimList& dims, int64_t a, int64_t b, const ProcessMesh& mesh) {
  MeshDimList kept;
  if (a <= 0 || b <= 0) return kept;
  int64_t parts = 1;
  for (int m : dims) {
    int64_t next = parts * mesh.dim_size(m);
    if (a % next == 0 && b % next == 0) {
      kept.push_back(m);
      parts = next;
    }
  }
  return kept;
}

AxisMap merge_same(std::span<const TensorSpec> tensors, std::string_view notation, std::string_view replicated) {
  constexpr size_t kInline = 16;
  if (tensors.size() <= kInline) {
    std::array<std::string_view, kInline> notas;
    std::array<DistAttr, kInline> dists;
    for (size_t k = 0; k < tensors.size(); ++k) notas[k] = notation, dists[k] = tensors[k].dist;
    return merge_axes(std::span<const std::string_view>(notas.data(), tensors.size()),
                      std::span<const DistAttr>(dists.data(), tensors.size()), replicated);
  }
  std::vector<std::string_view> notas(tensors.size(), notation);
  std::vector<DistAttr> dists;
  for (const TensorSpec& t : tensors) dists.push_back(t.dist);
  return merge_axes(notas, dists, replicated);
}

Placement join_partial(std::span<const TensorSpec> tensors, int m) {
  const TensorSpec* first = nullptr;
  for (const TensorSpec& t : tensors) {
    if (t.dist[m].is_partial()) {
      first = &t;
      break;
    }
  }
  if (first == nullptr) return Placement::replicate();
  const Placement p = first->dist[m];
  if (p.is_partial(ReduceOp::Max) || p.is_partial(ReduceOp::Min)) return p;
  for (const TensorSpec& t : tensors) {
    if (!(t.dist[m] == p)) return Placement::replicate();
  }
  return p;
}

void join_partials(std::span<const TensorSpec> tensors, const AxisMap& axes, std::span<DistAttr> required,
                   DistAttr& out) {
  for (int m = 0; m < out.mesh_ndim(); ++m) {
    if (axes.letter_of(m) != 0) continue;
    const Placement p = join_partial(tensors, m);
    if (!p.is_partial()) continue;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (tensors[k].dist[m] == p) required[k].set(m, p);
    }
    out.set(m, p);
  }
}

void check_variadic(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> tensors) {
  SW_CHECK(!tensors.empty(), "rule '{}' takes at least one input, got none", rule);
  check_inputs(rule, mesh, tensors, tensors.size());
}

void check_shape(std::string_view rule, const TensorSpec& spec, const Shape& want, std::string_view what) {
  SW_CHECK(spec.shape == want, "rule '{}': {} has shape {}, but the op gives {}", rule, what, spec.shape.to_string(),
           want.to_string());
}

namespace {

SpmdResult one_to_one(DistAttr req, DistAttr out) {
  SpmdResult r;
  r.inputs.push_back(std::move(req));
  r.outputs.push_back(std::move(out));
  return r;
}

SpmdResult grad_result(std::span<const TensorSpec> g, DistAttr dout, DistAttr dx) {
  SpmdResult r;
  r.inputs.reserve(3);
  r.inputs.push_back(g[0].dist);
  r.inputs.push_back(g[1].dist);
  r.inputs.push_back(std::move(dout));
  r.outputs.push_back(std::move(dx));
  return r;
}

// ---- expand

constexpr std::string_view kExpand = "expand", kSlice = "slice", kTile = "tile";

// x dim -> output dim (-1 when broadcast) and back.
DimMap expand_map(const Shape& in, const Shape& out, bool x_to_out) {
  DimMap map;
  const int lead = out.ndim() - in.ndim();
  if (x_to_out) {
    for (int d = 0; d < in.ndim(); ++d) map.set(d, expand_broadcasts(in, out, d) ? -1 : d + lead);
  } else {
    for (int j = 0; j < out.ndim(); ++j) map.set(j, j < lead || expand_broadcasts(in, out, j - lead) ? -1 : j - lead);
  }
  return map;
}

SpmdResult expand_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs(kExpand, mesh, in, 1);
  const DimMap map = expand_map(in[0].shape, expand_shape(in[0].shape, attrs), true);
  return one_to_one(keep_mapped(in[0].dist, map), remap(in[0].dist, map));
}

SpmdResult expand_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                          const Attrs& attrs) {
  check_inputs(kExpand, mesh, in, 1);
  check_inputs(kExpand, mesh, outs, 1);
  const Shape out = expand_shape(in[0].shape, attrs);
  check_shape(kExpand, outs[0], out, "the output");
  TensorSpec x{in[0].shape, in[0].dtype, remap(outs[0].dist, expand_map(in[0].shape, out, false))};
  return expand_forward(mesh, std::span<const TensorSpec>(&x, 1), attrs);
}

// Grad of a copy-to-many op: dout keeps its sharding on `back`'s mapped dims and on the `summed`
// dims (bit j), which make dx P(sum); other dims R. `sums` says whether any element is summed
// (then dout's P(max)/P(min) cannot pass).
SpmdResult sum_back_grad(std::span<const TensorSpec> g, const DimMap& back, uint32_t summed, bool sums) {
  const DistAttr& given = g[2].dist;
  DimMap keep;
  for (int j = 0; j < back.n; ++j) keep.set(j, back.to[static_cast<size_t>(j)] >= 0 || ((summed >> j) & 1u) ? j : -1);
  DistAttr dout = keep_mapped(given, keep);
  if (sums) dout = drop_max_min(dout);
  DistAttr dx = remap(dout, back);
  for (int j = 0; j < back.n; ++j) {
    if (!((summed >> j) & 1u)) continue;
    for (int m : dout.mesh_dims_of(j)) dx.set(m, Placement::partial(ReduceOp::Sum));
  }
  return grad_result(g, dout, dx);
}

SpmdResult expand_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs(kExpand, mesh, g, 3);
  const Shape& in = g[0].shape;
  const Shape out = expand_shape(in, attrs);
  check_shape(kExpand, g[1], out, "out");
  check_shape(kExpand, g[2], out, "dout");
  const DimMap back = expand_map(in, out, false);
  uint32_t summed = 0;
  bool sums = false;
  for (int j = 0; j < out.ndim(); ++j) {
    if (back.to[static_cast<size_t>(j)] >= 0) continue;
    summed |= 1u << j;
    sums = sums || out[j] > 1;
  }
  return sum_back_grad(g, back, summed, sums);
}

// ---- slice

DimMap slice_map(const SliceBounds& b, int ndim) {
  DimMap map;
  for (int d = 0; d < ndim; ++d) map.set(d, (b.sliced >> d) & 1u ? -1 : d);
  return map;
}

SpmdResult slice_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs(kSlice, mesh, in, 1);
  const DistAttr kept = keep_mapped(in[0].dist, slice_map(slice_bounds(in[0].shape, attrs), in[0].shape.ndim()));
  return one_to_one(kept, kept);
}

SpmdResult slice_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                         const Attrs& attrs) {
  check_inputs(kSlice, mesh, in, 1);
  check_inputs(kSlice, mesh, outs, 1);
  const SliceBounds b = slice_bounds(in[0].shape, attrs);
  check_shape(kSlice, outs[0], b.out, "the output");
  TensorSpec x{in[0].shape, in[0].dtype, keep_mapped(outs[0].dist, slice_map(b, in[0].shape.ndim()))};
  return slice_forward(mesh, std::span<const TensorSpec>(&x, 1), attrs);
}

SpmdResult slice_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs(kSlice, mesh, g, 3);
  const SliceBounds b = slice_bounds(g[0].shape, attrs);
  check_shape(kSlice, g[1], b.out, "out");
  check_shape(kSlice, g[2], b.out, "dout");
  const DistAttr dout = keep_mapped(g[2].dist, slice_map(b, g[0].shape.ndim()));
  return grad_result(g, dout, dout);
}

// ---- tile

SpmdResult tile_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs(kTile, mesh, in, 1);
  const TileSpec t = tile_spec(in[0].shape, attrs);
  DimMap map;
  for (int d = 0; d < in[0].shape.ndim(); ++d)
    map.set(d, t.reps[static_cast<size_t>(d + t.lead)] == 1 ? d + t.lead : -1);
  return one_to_one(keep_mapped(in[0].dist, map), remap(in[0].dist, map));
}

// Output dim -> x dim for the dims with repeat 1 (else -1).
DimMap tile_back(const TileSpec& t) {
  DimMap back;
  for (int j = 0; j < t.ndim; ++j) back.set(j, j >= t.lead && t.reps[static_cast<size_t>(j)] == 1 ? j - t.lead : -1);
  return back;
}

SpmdResult tile_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                        const Attrs& attrs) {
  check_inputs(kTile, mesh, in, 1);
  check_inputs(kTile, mesh, outs, 1);
  const TileSpec t = tile_spec(in[0].shape, attrs);
  check_shape(kTile, outs[0], t.out, "the output");
  TensorSpec x{in[0].shape, in[0].dtype, remap(outs[0].dist, tile_back(t))};
  return tile_forward(mesh, std::span<const TensorSpec>(&x, 1), attrs);
}

SpmdResult tile_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs(kTile, mesh, g, 3);
  const TileSpec t = tile_spec(g[0].shape, attrs);
  check_shape(kTile, g[1], t.out, "out");
  check_shape(kTile, g[2], t.out, "dout");
  uint32_t summed = 0;
  bool sums = false;
  for (int j = 0; j < t.ndim; ++j) {
    const int64_t r = t.reps[static_cast<size_t>(j)];
    sums = sums || r > 1;
    if (j < t.lead || (r != 1 && g[0].shape[j - t.lead] == 1)) summed |= 1u << j;
  }
  return sum_back_grad(g, tile_back(t), summed, sums);
}

}  // namespace

void add_copy_rules(ShapeRules& r) {
  r.expand = Rule{std::string(kExpand),
                    "1:1 dims keep their sharding (uneven too); broadcast dims R on x and the output, new leading "
                    "dims R; every Partial passes. Grad: dout keeps its sharding, a sharded summed (broadcast/leading) "
                    "dim makes dx P(sum); dout P(sum|avg) passes, P(max|min) only when nothing is summed; x, out "
                    "untouched",
                    expand_forward, expand_reverse, expand_grad};
  r.slice = Rule{std::string(kSlice),
                    "cut dims R (a slice of chunks is not a chunk layout), uncut dims keep their sharding (uneven "
                    "too), every Partial passes. Grad: dout's cut dims R, the rest and every Partial kept; dx alike; "
                    "x, out untouched",
                    slice_forward, slice_reverse, slice_grad};
  r.tile = Rule{std::string(kTile),
                    "repeated dims (repeat != 1) R on x and the output, repeat-1 dims keep their sharding, new leading "
                    "dims R; every Partial passes. Grad: repeat-1 dims pass, a sharded new leading dim or repeated "
                    "extent-1 dim makes dx P(sum), other repeated dims R; dout P(sum|avg) passes, P(max|min) only "
                    "when no repeat exceeds 1; x, out untouched",
                    tile_forward, tile_reverse, tile_grad};
}

}  // namespace shape_detail

ShapeRules shape_rules() {
  ShapeRules r;
  shape_detail::add_reshape_rules(r);
  shape_detail::add_join_rules(r);
  shape_detail::add_copy_rules(r);
  return r;
}

}  // namespace shardwise::ops
