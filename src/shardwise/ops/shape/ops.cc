// The shape ops: reshape, transpose, squeeze, unsqueeze, flatten, expand, concat, split, slice,
// stack, tile — registry entries (shape inference, kernels and gradients from kernels.h,
// SPMD rules from rules.cc, rules_join.cc and rules_reshape.cc) and their verification cases.
//
// Kernels whose attributes hold GLOBAL extents (reshape family, expand, slice, tile, and the
// gradients that rebuild an input's block) run in context: they read the global input shape
// from the KernelContext and infer their local output from the local input.
#include <string>
#include <utility>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/families.h"
#include "shardwise/ops/shape/rules.h"
#include "shardwise/ops/shape/kernels.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;
constexpr DType f64 = DType::F64, f32 = DType::F32, i64 = DType::I64;

VerifyCase one(Shape shape, DType dtype, Attrs attrs) {
  ValueGen gen = is_floating(dtype) ? ValueGen{} : ValueGen{Kind::Uniform, -9, 9};
  return VerifyCase{{shape}, {dtype}, std::move(attrs), {gen}};
}

VerifyCase many(std::vector<Shape> shapes, DType dtype, Attrs attrs) {
  ValueGen gen = is_floating(dtype) ? ValueGen{} : ValueGen{Kind::Uniform, -9, 9};
  std::vector<DType> dtypes(shapes.size(), dtype);
  std::vector<ValueGen> gens(shapes.size(), gen);
  return VerifyCase{std::move(shapes), std::move(dtypes), std::move(attrs), std::move(gens)};
}

std::vector<TensorMeta> meta(Shape shape, DType dtype) { return {{shape, dtype}}; }

const Shape& global_shape(const KernelContext& ctx, size_t i) {
  SW_CHECK(i < ctx.tensors.size(), "shape op: the kernel context lists {} tensors, tensor {} is needed",
           ctx.tensors.size(), i);
  return ctx.tensors[i].global_shape;
}

using OutShapeFn = Shape (*)(const Shape&, const Attrs&);

// reshape, squeeze, unsqueeze, flatten: one kernel (a local reshape between global shapes).
OpDef reshape_like(const char* name, spmd::Rule ShapeRules::*rule, OutShapeFn out_shape, std::string summary, std::vector<VerifyCase> cases) {
  OpDef def;
  def.name = name;
  def.family = "shape";
  def.rule = rules_of<shape_rules>().*rule;
  def.summary = std::move(summary);
  def.infer = [out_shape](std::span<const TensorMeta> in, const Attrs& attrs) {
    return meta(out_shape(in[0].shape, attrs), in[0].dtype);
  };
  def.forward_in_context = [name, out_shape](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    const Shape& global = global_shape(ctx, 0);
    return std::vector<Tensor>{reshape_local(in[0], global, out_shape(global, attrs), name)};
  };
  def.backward_in_context = [name, out_shape](std::span<const Tensor>, std::span<const Tensor>,
                                              std::span<const Tensor> dout, const Attrs& attrs,
                                              const KernelContext& ctx) {
    const Shape& global = global_shape(ctx, 0);
    return std::vector<Tensor>{reshape_local(dout[0], out_shape(global, attrs), global, name)};
  };
  def.backward_reads = std::vector<int>{};
  def.cases = std::move(cases);
  return def;
}

Attrs shape_attr(std::vector<int64_t> s) { return Attrs{{"shape", std::move(s)}}; }
Attrs axis_list(std::vector<int64_t> a) { return Attrs{{"axis", std::move(a)}}; }

void add_reshape_family(OpRegistry& registry) {
  // Reshape cases: even flatten and split (12x12 -> 144, 24 -> 2x12: the '2' piece keeps a mesh-2
  // sharding, not a mesh-3 one), a split whose first piece divides mesh 3 only (12x6 -> 3x4x6),
  // an uneven flatten (5x7), the hard case in small ([1,512,4096] -> [1,2,256,4096] as
  // 1x12x2 -> 1x2x6x2), a regroup (6x4 -> 4x6), extent-1 dims inside and around groups; flattens
  // and splits whose leading dims are cut into single entries, so a later dim keeps its sharding
  // too (2x4x3 -> 24, 3x2x2 -> 12, 24 -> 2x3x4, 6x2 -> 2x3x2).
  registry.add(reshape_like("reshape", &ShapeRules::reshape, reshape_shape,
                            "view with a new shape (shape=[...], one -1 inferred, 0 is a plain extent); row-major "
                            "order kept; grad: dout reshaped back",
                            {one({12, 12}, f64, shape_attr({144})), one({24}, f64, shape_attr({2, 12})),
                             one({12, 6}, f64, shape_attr({3, 4, 6})), one({5, 7}, f64, shape_attr({35})),
                             one({1, 12, 2}, f64, shape_attr({1, 2, 6, 2})), one({6, 4}, f32, shape_attr({4, 6})),
                             one({2, 5}, i64, shape_attr({5, 2})), one({12}, f64, shape_attr({-1, 3})),
                             one({2, 1, 3}, f64, shape_attr({6})), one({5, 1}, f64, shape_attr({1, 5})),
                             one({2, 4, 3}, f64, shape_attr({24})), one({3, 2, 2}, f64, shape_attr({12})),
                             one({24}, f64, shape_attr({2, 3, 4})), one({6, 2}, f64, shape_attr({2, 3, 2}))}));
  registry.add(reshape_like(
      "squeeze", &ShapeRules::squeeze, squeeze_shape,
      "drops extent-1 dims (axis=[...]; absent/empty: all of them); a listed dim of extent != 1 "
      "is an Error; grad: dout reshaped back",
      {one({12, 12}, f64, axis_list({})), one({1, 12, 1}, f64, axis_list({})), one({5, 1, 7}, f64, axis_list({1})),
       one({1, 6}, f32, axis_list({0})), one({2, 1}, i64, axis_list({-1})), one({1, 1, 5}, f64, axis_list({0}))}));
  registry.add(reshape_like(
      "unsqueeze", &ShapeRules::unsqueeze, unsqueeze_shape,
      "inserts extent-1 dims at axis=[...] (positions in the OUTPUT, negative allowed); grad: "
      "dout reshaped back",
      {one({12, 12}, f64, axis_list({0})), one({5, 7}, f64, axis_list({1, 3})), one({1, 6}, f32, axis_list({-1})),
       one({2, 5}, i64, axis_list({0})), one({3, 1}, f64, axis_list({1}))}));
  auto range = [](int64_t start, int64_t stop) { return Attrs{{"start_axis", start}, {"stop_axis", stop}}; };
  registry.add(
      reshape_like("flatten", &ShapeRules::flatten, flatten_shape,
                   "merges dims start_axis..stop_axis (default 0..-1) into one; a scalar becomes [1]; grad: "
                   "dout reshaped back",
                   {one({12, 12}, f64, range(0, 1)), one({5, 7, 2}, f64, range(0, 1)), one({2, 6, 5}, f64, range(1, 2)),
                    one({1, 6}, f32, range(0, -1)), one({4, 3}, i64, range(0, -1)), one({3, 1, 4}, f64, range(0, 1))}));
}

OpDef make_transpose() {
  OpDef def;
  def.name = "transpose";
  def.rule = rules_of<shape_rules>().transpose;
  def.family = "shape";
  def.summary =
      "permutes the dims: output dim j is input dim perm[j] (perm=[...], a permutation); grad: dout "
      "transposed by the inverse permutation";
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    return meta(transpose_shape(in[0].shape, transpose_perm(in[0].shape, attrs)), in[0].dtype);
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{transpose(in[0], transpose_perm(in[0].shape(), attrs))};
  };
  def.backward = [](std::span<const Tensor>, std::span<const Tensor>, std::span<const Tensor> dout,
                    const Attrs& attrs) {
    return std::vector<Tensor>{transpose(dout[0], transpose_perm(dout[0].shape(), attrs).inverse())};
  };
  def.backward_reads = std::vector<int>{};
  auto perm = [](std::vector<int64_t> p) { return Attrs{{"perm", std::move(p)}}; };
  def.cases = {one({12, 12}, f64, perm({1, 0})), one({5, 7}, f64, perm({1, 0})), one({2, 3, 4}, f64, perm({2, 0, 1})),
               one({1, 6}, f32, perm({-1, 0})),  one({5, 7}, i64, perm({1, 0})), one({3, 1, 5}, f64, perm({0, 2, 1}))};
  return def;
}

OpDef make_expand() {
  OpDef def;
  def.name = "expand";
  def.rule = rules_of<shape_rules>().expand;
  def.family = "shape";
  def.summary =
      "broadcast_to: NumPy broadcasting to shape=[...] (right-aligned; -1 keeps a dim; only extent 1 "
      "expands); grad: dout summed over the expanded and new leading dims";
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    return meta(expand_shape(in[0].shape, attrs), in[0].dtype);
  };
  def.forward_in_context = [](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    const Shape& global = global_shape(ctx, 0);
    return std::vector<Tensor>{expand_local(in[0], global, expand_shape(global, attrs))};
  };
  def.backward_in_context = [](std::span<const Tensor>, std::span<const Tensor>, std::span<const Tensor> dout,
                               const Attrs& attrs, const KernelContext& ctx) {
    const Shape& global = global_shape(ctx, 0);
    return std::vector<Tensor>{expand_backward_local(dout[0], global, expand_shape(global, attrs))};
  };
  def.cases = {one({12}, f64, shape_attr({12, 12})),    one({5, 1}, f64, shape_attr({5, 7})),
               one({1, 7}, f64, shape_attr({2, 5, 7})), one({2, 1}, f32, shape_attr({2, 6})),
               one({1, 5}, i64, shape_attr({4, -1})),   one({1, 5}, f64, shape_attr({1, 5}))};
  return def;
}

OpDef make_concat() {
  OpDef def;
  def.name = "concat";
  def.rule = rules_of<shape_rules>().concat;
  def.family = "shape";
  def.summary = "joins x1..xn along axis (default 0); extents equal elsewhere, one dtype; grad: dout split back";
  def.num_inputs = -1;
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    const int axis = concat_axis(attrs, in[0].shape.ndim(), "concat");
    Shape out = in[0].shape;
    out[axis] = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      check_concat_operand(in[0].shape, in[0].dtype, in[k].shape, in[k].dtype, axis, k, "concat");
      out[axis] += in[k].shape[axis];
    }
    return meta(out, in[0].dtype);
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{concat(in, concat_axis(attrs, in[0].ndim(), "concat"))};
  };
  def.backward_in_context = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                               const Attrs& attrs, const KernelContext& ctx) {
    const int axis = concat_axis(attrs, dout[0].ndim(), "concat");
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < in.size(); ++k) sizes.push_back(global_shape(ctx, k)[axis]);
    return split(dout[0], axis, sizes);
  };
  // Two inputs of rank <= 2, or three of rank 1, keep the enumeration small (three rank-2 inputs
  // give 7^6 placement combinations per 2-D mesh); the gradient check leaves x_i and out as given,
  // so nearly every gradient combination is a distinct layout: few cases.
  auto axis = [](int64_t a) { return Attrs{{"axis", a}}; };
  def.cases = {many({{12, 12}, {12, 12}}, f64, axis(1)), many({{5, 7}, {5, 1}}, f64, axis(1)),
               many({{2}, {3}, {1}}, f32, axis(0)), many({{1, 6}, {1, 3}}, i64, axis(-1))};
  return def;
}

OpDef make_split() {
  OpDef def;
  def.name = "split";
  def.rule = rules_of<shape_rules>().split;
  def.family = "shape";
  def.summary =
      "cuts x along axis (default 0) into sections=[extents] (one -1 takes the rest) or num=k equal parts; "
      "grad: the piece gradients concatenated (an undefined one counts as zeros)";
  def.num_outputs = -1;
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    const int axis = concat_axis(attrs, in[0].shape.ndim(), "split");
    std::vector<TensorMeta> out;
    for (int64_t size : split_sizes(in[0].shape, attrs)) {
      Shape piece = in[0].shape;
      piece[axis] = size;
      out.push_back({piece, in[0].dtype});
    }
    return out;
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return split(in[0], concat_axis(attrs, in[0].ndim(), "split"), split_sizes(in[0].shape(), attrs));
  };
  def.backward_in_context = [](std::span<const Tensor>, std::span<const Tensor>, std::span<const Tensor> dout,
                               const Attrs& attrs, const KernelContext& ctx) {
    const Shape& global = global_shape(ctx, 0);
    const int axis = concat_axis(attrs, global.ndim(), "split");
    const std::vector<int64_t> sizes = split_sizes(global, attrs);
    SW_CHECK(dout.size() == sizes.size(), "split backward: {} piece gradients for {} pieces", dout.size(),
             sizes.size());
    const Tensor* known = nullptr;
    for (const Tensor& g : dout) {
      if (g.defined()) known = &g;
    }
    if (known == nullptr) return std::vector<Tensor>{Tensor()};
    std::vector<Tensor> parts;
    for (size_t k = 0; k < dout.size(); ++k) {
      if (dout[k].defined()) {
        parts.push_back(dout[k]);
        continue;
      }
      Shape piece = known->shape();  // the split axis is whole on every piece
      piece[axis] = sizes[k];
      parts.emplace_back(known->dtype(), piece);
    }
    return std::vector<Tensor>{concat(parts, axis)};
  };
  auto num = [](int64_t axis, int64_t n) { return Attrs{{"axis", axis}, {"num", n}}; };
  auto sections = [](int64_t axis, std::vector<int64_t> s) {
    return Attrs{{"axis", axis}, {"sections", std::move(s)}};
  };
  def.cases = {one({12, 12}, f64, num(1, 2)),         one({5, 7}, f64, sections(1, {2, -1, 1})),
               one({2, 6}, f64, num(1, 3)),           one({1, 6}, f32, sections(-1, {4, 2})),
               one({5, 4}, i64, sections(0, {2, 3})), one({7, 2}, f64, sections(0, {7, 0}))};
  return def;
}

OpDef make_slice() {
  OpDef def;
  def.name = "slice";
  def.rule = rules_of<shape_rules>().slice;
  def.family = "shape";
  def.summary =
      "x[starts:ends] on axes (Python bounds: negative counts from the end, clamped; step 1); grad: dout "
      "pasted into zeros";
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    return meta(slice_bounds(in[0].shape, attrs).out, in[0].dtype);
  };
  def.forward_in_context = [](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    return std::vector<Tensor>{slice_local(in[0], global_shape(ctx, 0), attrs)};
  };
  def.backward_in_context = [](std::span<const Tensor>, std::span<const Tensor>, std::span<const Tensor> dout,
                               const Attrs& attrs, const KernelContext& ctx) {
    return std::vector<Tensor>{slice_backward_local(dout[0], global_shape(ctx, 0), attrs)};
  };
  auto cut = [](std::vector<int64_t> axes, std::vector<int64_t> starts, std::vector<int64_t> ends) {
    return Attrs{{"axes", std::move(axes)}, {"starts", std::move(starts)}, {"ends", std::move(ends)}};
  };
  def.cases = {one({12, 12}, f64, cut({1}, {2}, {-3})), one({5, 7}, f64, cut({0, 1}, {1, -4}, {100, 6})),
               one({2, 6}, f64, cut({1}, {0}, {6})),    one({1, 6}, f32, cut({-1}, {-2}, {1000})),
               one({5, 7}, i64, cut({1}, {-3}, {-1})),  one({4, 3, 5}, f64, cut({2, 0}, {1, -9}, {4, 9})),
               one({5, 3}, f64, cut({0}, {3}, {1}))};
  return def;
}

OpDef make_stack() {
  OpDef def;
  def.name = "stack";
  def.rule = rules_of<shape_rules>().stack;
  def.family = "shape";
  def.summary = "stacks equal-shaped x1..xn along a new dim at axis (default 0) of the output; grad: dout unstacked";
  def.num_inputs = -1;
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    const int axis = stack_axis(attrs, in[0].shape.ndim());
    Shape out;
    for (int d = 0; d <= in[0].shape.ndim(); ++d) {
      out.push_back(d == axis ? static_cast<int64_t>(in.size()) : in[0].shape[d < axis ? d : d - 1]);
    }
    for (size_t k = 1; k < in.size(); ++k) {
      SW_CHECK(in[k].shape == in[0].shape && in[k].dtype == in[0].dtype,
               "stack: input {} is {} {} but input 0 is {} {}; all inputs need the same shape and dtype", k,
               dtype_name(in[k].dtype), in[k].shape.to_string(), dtype_name(in[0].dtype), in[0].shape.to_string());
    }
    return meta(out, in[0].dtype);
  };
  def.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{stack(in, stack_axis(attrs, in[0].ndim()))};
  };
  def.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                    const Attrs& attrs) {
    const int axis = stack_axis(attrs, dout[0].ndim() - 1);
    SW_CHECK(dout[0].shape()[axis] == static_cast<int64_t>(in.size()),
             "stack backward: dout {} has extent {} along the stacked dim {}, expected {} (one per input)",
             dout[0].shape().to_string(), dout[0].shape()[axis], axis, in.size());
    return unstack(dout[0], axis);
  };
  auto axis = [](int64_t a) { return Attrs{{"axis", a}}; };
  def.cases = {many({{12}, {12}, {12}}, f64, axis(1)), many({{5, 7}, {5, 7}}, f64, axis(1)),
               many({{1, 6}, {1, 6}}, f32, axis(-1)), many({{5}, {5}}, i64, axis(0))};
  return def;
}

OpDef make_tile() {
  OpDef def;
  def.name = "tile";
  def.rule = rules_of<shape_rules>().tile;
  def.family = "shape";
  def.summary =
      "repeats x repeat_times=[...] times along each dim (NumPy tile: a shorter list is padded with leading "
      "1s, a longer one adds leading dims); grad: the tiles of dout summed";
  def.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    return meta(tile_spec(in[0].shape, attrs).out, in[0].dtype);
  };
  def.forward_in_context = [](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    return std::vector<Tensor>{tile_local(in[0], global_shape(ctx, 0), attrs)};
  };
  def.backward_in_context = [](std::span<const Tensor>, std::span<const Tensor>, std::span<const Tensor> dout,
                               const Attrs& attrs, const KernelContext& ctx) {
    return std::vector<Tensor>{tile_backward_local(dout[0], global_shape(ctx, 0), attrs)};
  };
  auto reps = [](std::vector<int64_t> r) { return Attrs{{"repeat_times", std::move(r)}}; };
  def.cases = {one({12}, f64, reps({2, 1})),   one({5, 7}, f64, reps({1, 2})),    one({2, 3}, f64, reps({3})),
               one({1, 6}, f32, reps({4, 1})), one({5, 1}, i64, reps({2, 1, 3})), one({1, 5}, f64, reps({1, 1}))};
  return def;
}

}  // namespace

void register_shape_ops(OpRegistry& registry) {
  add_reshape_family(registry);
  registry.add(make_transpose());
  registry.add(make_expand());
  registry.add(make_concat());
  registry.add(make_split());
  registry.add(make_slice());
  registry.add(make_stack());
  registry.add(make_tile());
}

}  // namespace shardwise::ops
