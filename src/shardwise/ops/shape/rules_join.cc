// SPMD rules of concat, stack and split.
//
// concat(x1..xn; axis): the concat axis must be Replicate on every input (a chunk of the result
// is not made of chunks of the inputs). The other dims are labelled alike on every input and
// merged with spmd::merge_axes: the first input that shards a dim wins, a mesh dim shards one dim;
// every input is resharded to the merged layout and the output has it too. Partial, on a mesh
// dim that shards no dim: join_partial (rules.h) — P(sum)/P(avg) pass only when EVERY
// input has it; P(max)/P(min) (the first input's Partial there) pass, inputs with another
// placement are made Replicate. Anything else: Replicate.
// stack(x1..xn; axis): as concat, no dim excluded: the inputs' dims merge the same way, the new
// output dim (at axis) is Replicate, the others follow their input dims.
// split(x; axis, sections | num): the split axis Replicate, the other dims keep their sharding
// (uneven too), every Partial passes; every piece gets that distribution.
//
// Reverse: the wanted output(s) are mapped back (the axis / the new dim dropped, Partials copied;
// split merges its outputs like concat's inputs) and the forward rule gives the consistent answer.
// Grad:
//  concat: dx_i = slice of dout along axis: dout's axis Replicate, other dims and every Partial
//          kept; each dx_i takes that distribution. The x_i and out are not read (the kernel takes
//          the inputs' global extents from its context): untouched.
//  stack:  dx_i = dout[..., i, ...]: dout's new dim Replicate, the rest kept; dx_i drops that dim.
//  split:  dx = concat of the piece gradients: exactly concat's forward rule on the douts.
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/shape/rules.h"
#include "shardwise/ops/shape/kernels.h"

namespace shardwise::ops::shape_detail {
using namespace spmd;

namespace {

constexpr std::string_view kConcat = "concat", kStack = "stack", kSplit = "split";

// The concat forward on `in` (also split's reverse on its outputs and its gradient on the douts).
SpmdResult concat_forward_on(std::string_view name, std::span<const TensorSpec> in, int axis, const ProcessMesh& mesh) {
  const int nd = in[0].shape.ndim();
  for (size_t k = 1; k < in.size(); ++k) {
    check_concat_operand(in[0].shape, in[0].dtype, in[k].shape, in[k].dtype, axis, k, name);
  }
  std::string_view letters = axis_letters(nd);
  AxisMap axes = merge_same(in, letters, letters.substr(static_cast<size_t>(axis), 1));
  SpmdResult r;
  r.inputs.reserve(in.size());
  for (size_t k = 0; k < in.size(); ++k) r.inputs.push_back(dist_from_axes(letters, axes, mesh.ndim()));
  DistAttr out = dist_from_axes(letters, axes, mesh.ndim());
  join_partials(in, axes, r.inputs, out);
  r.outputs.push_back(out);
  return r;
}

SpmdResult concat_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_variadic(kConcat, mesh, in);
  return concat_forward_on(kConcat, in, concat_axis(attrs, in[0].shape.ndim(), kConcat), mesh);
}

SpmdResult concat_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                          const Attrs& attrs) {
  check_variadic(kConcat, mesh, in);
  check_inputs(kConcat, mesh, outs, 1);
  const int axis = concat_axis(attrs, in[0].shape.ndim(), kConcat);
  DimMap keep;
  for (int d = 0; d < outs[0].shape.ndim(); ++d) keep.set(d, d == axis ? -1 : d);
  const DistAttr want = keep_mapped(outs[0].dist, keep);
  // Every input takes the wanted layout (any Partial is then common to all, so it passes).
  constexpr size_t kInline = 16;
  if (in.size() <= kInline) {
    std::array<TensorSpec, kInline> xs;
    for (size_t k = 0; k < in.size(); ++k) xs[k] = {in[k].shape, in[k].dtype, want};
    return concat_forward_on(kConcat, std::span<const TensorSpec>(xs.data(), in.size()), axis, mesh);
  }
  std::vector<TensorSpec> xs;
  for (const TensorSpec& x : in) xs.push_back({x.shape, x.dtype, want});
  return concat_forward_on(kConcat, xs, axis, mesh);
}

// Grad of concat and stack: inputs x_1..x_n, out, dout. dout's dim `axis` is made Replicate; for
// stack (`stacked`) the x_i lack that dim, so the dims after it shift down by one.
SpmdResult slice_back_grad(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, int axis,
                           bool stacked) {
  const size_t n = g.size() - 2;
  const TensorSpec& dout = g[n + 1];
  DimMap keep, back;
  for (int d = 0; d < dout.shape.ndim(); ++d) {
    keep.set(d, d == axis ? -1 : d);
    back.set(d, d == axis ? -1 : (stacked && d > axis ? d - 1 : d));
  }
  SW_CHECK(g[n].shape == dout.shape, "{} grad: out {} and dout {} differ in shape", name, g[n].shape.to_string(),
           dout.shape.to_string());
  SpmdResult r;
  r.inputs.reserve(n + 2);
  for (size_t k = 0; k <= n; ++k) r.inputs.push_back(g[k].dist);
  r.inputs.push_back(keep_mapped(dout.dist, keep));
  const DistAttr dx = remap(r.inputs.back(), back);
  r.outputs.assign(n, dx);
  return r;
}

SpmdResult concat_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  SW_CHECK(g.size() >= 3, "rule 'concat' grad takes x_1..x_n, out, dout; got {} tensors", g.size());
  check_inputs(kConcat, mesh, g, g.size());
  const int axis = concat_axis(attrs, g[0].shape.ndim(), kConcat);
  return slice_back_grad(kConcat, mesh, g, axis, false);
}

// ---- stack

SpmdResult stack_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_variadic(kStack, mesh, in);
  const int nd = in[0].shape.ndim();
  const int axis = stack_axis(attrs, nd);
  for (size_t k = 1; k < in.size(); ++k) {
    SW_CHECK(in[k].shape == in[0].shape && in[k].dtype == in[0].dtype,
             "stack: input {} is {} {} but input 0 is {} {}; all inputs need the same shape and dtype", k,
             dtype_name(in[k].dtype), in[k].shape.to_string(), dtype_name(in[0].dtype), in[0].shape.to_string());
  }
  std::string_view letters = axis_letters(nd);
  AxisMap axes = merge_same(in, letters, "");
  SpmdResult r;
  r.inputs.reserve(in.size());
  for (size_t k = 0; k < in.size(); ++k) r.inputs.push_back(dist_from_axes(letters, axes, mesh.ndim()));
  DimMap up;
  for (int d = 0; d < nd; ++d) up.set(d, d < axis ? d : d + 1);
  DistAttr out = remap(r.inputs[0], up);
  join_partials(in, axes, r.inputs, out);
  r.outputs.push_back(out);
  return r;
}

SpmdResult stack_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                         const Attrs& attrs) {
  check_variadic(kStack, mesh, in);
  check_inputs(kStack, mesh, outs, 1);
  const int axis = stack_axis(attrs, in[0].shape.ndim());
  SW_CHECK(outs[0].shape.ndim() == in[0].shape.ndim() + 1, "stack: the output has rank {}, the inputs rank {}",
           outs[0].shape.ndim(), in[0].shape.ndim());
  DimMap down;
  for (int j = 0; j < outs[0].shape.ndim(); ++j) down.set(j, j == axis ? -1 : (j < axis ? j : j - 1));
  const DistAttr want = remap(outs[0].dist, down);
  constexpr size_t kInline = 16;
  if (in.size() <= kInline) {
    std::array<TensorSpec, kInline> xs;
    for (size_t k = 0; k < in.size(); ++k) xs[k] = {in[k].shape, in[k].dtype, want};
    return stack_forward(mesh, std::span<const TensorSpec>(xs.data(), in.size()), attrs);
  }
  std::vector<TensorSpec> xs;
  for (const TensorSpec& x : in) xs.push_back({x.shape, x.dtype, want});
  return stack_forward(mesh, xs, attrs);
}

SpmdResult stack_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  SW_CHECK(g.size() >= 3, "rule 'stack' grad takes x_1..x_n, out, dout; got {} tensors", g.size());
  check_inputs(kStack, mesh, g, g.size());
  const int axis = stack_axis(attrs, g[0].shape.ndim());
  return slice_back_grad(kStack, mesh, g, axis, true);
}

// ---- split

SpmdResult split_forward(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs(kSplit, mesh, in, 1);
  const int count = split_count(in[0].shape, attrs);
  const int axis = concat_axis(attrs, in[0].shape.ndim(), kSplit);
  DimMap keep;
  for (int d = 0; d < in[0].shape.ndim(); ++d) keep.set(d, d == axis ? -1 : d);
  SpmdResult r;
  r.inputs.push_back(keep_mapped(in[0].dist, keep));
  r.outputs.assign(static_cast<size_t>(count), r.inputs[0]);
  return r;
}

SpmdResult split_reverse(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> outs,
                         const Attrs& attrs) {
  check_inputs(kSplit, mesh, in, 1);
  const int count = split_count(in[0].shape, attrs);
  check_inputs(kSplit, mesh, outs, static_cast<size_t>(count));
  const int axis = concat_axis(attrs, in[0].shape.ndim(), kSplit);
  // The outputs merge like concat's inputs; x takes the merged layout and the joint Partial.
  SpmdResult merged = concat_forward_on(kSplit, outs, axis, mesh);
  TensorSpec x{in[0].shape, in[0].dtype, merged.outputs[0]};
  return split_forward(mesh, std::span<const TensorSpec>(&x, 1), attrs);
}

SpmdResult split_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  SW_CHECK(!g.empty(), "rule 'split' grad takes x, the pieces and their gradients; got none");
  const auto count = static_cast<size_t>(split_count(g[0].shape, attrs));
  check_inputs(kSplit, mesh, g, 1 + 2 * count);
  const int axis = concat_axis(attrs, g[0].shape.ndim(), kSplit);
  SpmdResult joined = concat_forward_on(kSplit, g.subspan(1 + count, count), axis, mesh);
  SpmdResult r;
  r.inputs.reserve(1 + 2 * count);
  for (size_t k = 0; k <= count; ++k) r.inputs.push_back(g[k].dist);
  for (const DistAttr& d : joined.inputs) r.inputs.push_back(d);
  r.outputs.push_back(joined.outputs[0]);
  return r;
}

}  // namespace

void add_join_rules(ShapeRules& r) {
  r.concat = Rule{std::string(kConcat),
                    "concat axis R on every input; other dims merged across inputs (first input wins, a mesh dim "
                    "shards one dim), output alike; P(sum|avg) passes only when every input has it, P(max|min) "
                    "passes (inputs without it -> R); else R. Grad: dout's axis R, the rest and every Partial kept, "
                    "each dx_i alike; x_i, out untouched",
                    concat_forward, concat_reverse, concat_grad};
  r.stack = Rule{std::string(kStack),
                    "inputs merged dim by dim (first input wins), the new output dim R, the others follow; "
                    "P(sum|avg) passes only when every input has it, P(max|min) passes (inputs without it -> R). "
                    "Grad: dout's new dim R, the rest and every Partial kept, each dx_i drops that dim",
                    stack_forward, stack_reverse, stack_grad};
  r.split = Rule{std::string(kSplit),
                    "split axis R, other dims keep their sharding, every Partial passes; every piece alike. Grad: "
                    "concat's rule on the piece gradients (axis R, merged, first wins; joint Partial); x and the "
                    "pieces untouched",
                    split_forward, split_reverse, split_grad};
}

}  // namespace shardwise::ops::shape_detail
