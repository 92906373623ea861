// The misc ops: dropout, cumsum, argmax, argmin, topk (kernels in kernels.h, rules in
// rules.cc).
//
// Attributes:
//  dropout: p (float in [0, 1), default 0.5), seed (int, required), stream (int, default 0),
//           training (bool, default true). Outputs (out, mask u8).
//  cumsum:  axis (int, required).
//  argmax, argmin: axis (int, required), keepdim (bool, default false). Output i64.
//  topk:    k (int, required), axis (int, default -1), largest (default true), sorted (default
//           true). Outputs (values, indices i64).
#include "shardwise/core/error.h"
#include "shardwise/ops/families.h"
#include "shardwise/ops/misc/rules.h"
#include "shardwise/ops/misc/kernels.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;

constexpr DType f64 = DType::F64, f32 = DType::F32, i64 = DType::I64, i32 = DType::I32;

VerifyCase one(Shape shape, DType dtype, Attrs attrs, ValueGen gen = {}) {
  return VerifyCase{{shape}, {dtype}, std::move(attrs), {gen}};
}

// Shapes used below: 12 and 12x6 divide every test mesh (co-sharding on [2,3] included), 5x7
// and 4x3x5 do not, 1x6 and 2x5 leave some shards empty.
std::vector<VerifyCase> dropout_cases() {
  auto attrs = [](double p, int64_t seed, int64_t stream, bool training) {
    Attrs a{{"p", p}, {"seed", seed}};
    if (stream != 0) a.set("stream", stream);
    if (!training) a.set("training", false);
    return a;
  };
  return {
      one({12}, f64, attrs(0.3, 11, 0, true)),
      one({12, 6}, f64, attrs(0.3, 12, 0, true)),
      one({5, 7}, f64, attrs(0.3, 13, 3, true)),
      one({1, 6}, f64, attrs(0.3, 14, 0, true)),
      one({2, 5}, f64, attrs(0.5, 15, 1, true)),
      one({4, 3, 5}, f64, attrs(0.3, 16, 0, true)),
      one({5, 7}, f32, attrs(0.3, 17, 0, true)),
      one({5, 7}, f64, attrs(0.0, 18, 0, true)),
      one({12, 6}, f64, attrs(0.3, 19, 0, false)),
  };
}

std::vector<VerifyCase> cumsum_cases() {
  auto axis = [](int64_t a) { return Attrs{{"axis", a}}; };
  ValueGen ints{Kind::Uniform, -9, 9};
  return {
      one({12}, f64, axis(0)),          one({12, 6}, f64, axis(1)),     one({12, 6}, f64, axis(0)),
      one({5, 7}, f64, axis(-1)),       one({1, 6}, f64, axis(1)),      one({2, 5}, f64, axis(0)),
      one({4, 3, 5}, f64, axis(1)),     one({5, 7}, f32, axis(0)),      one({12, 6}, i64, axis(0), ints),
      one({5, 7}, i32, axis(1), ints),
  };
}

std::vector<VerifyCase> arg_reduce_cases() {
  auto attrs = [](int64_t a, bool keepdim) {
    Attrs at{{"axis", a}};
    if (keepdim) at.set("keepdim", true);
    return at;
  };
  ValueGen ties{Kind::SmallInts, -2, 2};  // frequent ties prove the first-index rule across shards
  return {
      one({12}, f64, attrs(0, false), ties),       one({12, 6}, f64, attrs(1, true), ties),
      one({12, 6}, f64, attrs(0, false)),          one({5, 7}, f64, attrs(-1, false), ties),
      one({5, 7}, f64, attrs(0, true), ties),      one({1, 6}, f64, attrs(0, false), ties),
      one({2, 5}, f64, attrs(1, false), ties),     one({4, 3, 5}, f64, attrs(1, false), ties),
      one({4, 3, 5}, f64, attrs(2, true)),         one({5, 7}, f32, attrs(1, false)),
      one({12, 6}, i64, attrs(1, false), ties),    one({5, 7}, i32, attrs(0, true), ties),
  };
}

std::vector<VerifyCase> topk_cases() {
  auto attrs = [](int64_t k, int64_t axis, bool largest, bool sorted) {
    Attrs a{{"k", k}, {"axis", axis}};
    if (!largest) a.set("largest", false);
    if (!sorted) a.set("sorted", false);
    return a;
  };
  ValueGen ties{Kind::SmallInts, -2, 2};
  return {
      one({12}, f64, attrs(4, 0, true, true), ties),      one({12, 6}, f64, attrs(2, -1, true, true), ties),
      one({12, 6}, f64, attrs(3, 0, false, true), ties),  one({5, 7}, f64, attrs(3, 1, true, false), ties),
      one({5, 7}, f64, attrs(5, 0, false, true)),         one({1, 6}, f64, attrs(2, 1, true, true), ties),
      one({2, 5}, f64, attrs(5, 1, false, false), ties),  one({4, 3, 5}, f64, attrs(2, 1, true, true), ties),
      one({4, 3, 5}, f64, attrs(0, 2, true, true)),       one({5, 7}, f32, attrs(2, 1, true, true)),
      one({12, 6}, i64, attrs(3, 1, true, true), ties),   one({5, 7}, i32, attrs(2, 0, false, true), ties),
  };
}

void add_dropout(OpRegistry& registry) {
  OpDef op;
  op.name = "dropout";
  op.family = "misc";
  op.rule = rules_of<misc_rules>().dropout;
  op.summary =
      "(out, mask) = dropout(x): keep x[g] iff Philox(seed, stream).uniform(g) >= p with g the GLOBAL row-major "
      "index (any sharding reproduces the single-device mask); out = x * mask / (1 - p); mask u8; floats only; "
      "training=false: out = x, mask = 1. Gradient: dx = dy * mask / (1 - p)";
  op.num_inputs = 1;
  op.num_outputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_dropout_dtype(in[0].dtype);
    dropout_args(attrs);
    return std::vector<TensorMeta>{{in[0].shape, in[0].dtype}, {in[0].shape, DType::U8}};
  };
  op.forward_in_context = [](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    SW_CHECK(!ctx.tensors.empty(), "dropout: the kernel context has no entry for x");
    const ShardInfo& info = ctx.tensors[0];
    Shape global = info.global_shape;
    std::array<int64_t, kMaxDims> offset = info.offset;
    if (ctx.sample_offset != 0 && global.ndim() > 0) {  // dim 0 counts samples from the data's start
      SW_CHECK(ctx.sample_offset > 0, "dropout: a negative sample offset {}", ctx.sample_offset);
      global[0] += ctx.sample_offset;
      offset[0] += ctx.sample_offset;
    }
    DropoutResult r = dropout(in[0], global, std::span<const int64_t>(offset.data(), static_cast<size_t>(in[0].ndim())),
                              dropout_args(attrs));
    return std::vector<Tensor>{r.out, r.mask};
  };
  // The mask is an output, so the gradient reads it; the out-grad of the mask is ignored.
  op.backward = [](std::span<const Tensor>, std::span<const Tensor> out, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    return std::vector<Tensor>{dropout_backward(dout[0], out[1], dropout_args(attrs))};
  };
  op.cases = dropout_cases();
  registry.add(std::move(op));
}

void add_cumsum(OpRegistry& registry) {
  OpDef op;
  op.name = "cumsum";
  op.family = "misc";
  op.rule = rules_of<misc_rules>().cumsum;
  op.summary =
      "inclusive prefix sum along axis; floats accumulate in double, integers wrap; no bool. Gradient: the "
      "reverse cumsum of dy (floats; integers take no gradient)";
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_cumsum_dtype(in[0].dtype);
    misc_axis(attrs, in[0].shape.ndim(), "cumsum", std::nullopt);
    return std::vector<TensorMeta>{in[0]};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    SW_CHECK(in[0].defined(), "cumsum: the input tensor is undefined");
    return std::vector<Tensor>{cumsum(in[0], misc_axis(attrs, in[0].ndim(), "cumsum", std::nullopt))};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    if (!is_floating(in[0].dtype())) return std::vector<Tensor>{Tensor()};
    return std::vector<Tensor>{cumsum_backward(dout[0], misc_axis(attrs, in[0].ndim(), "cumsum", std::nullopt))};
  };
  op.cases = cumsum_cases();
  registry.add(std::move(op));
}

void add_arg_reduce(OpRegistry& registry, bool want_max) {
  std::string name = want_max ? "argmax" : "argmin";
  OpDef op;
  op.name = name;
  op.family = "misc";
  op.rule = rules_of<misc_rules>().arg_reduce;
  op.summary = fmt::format(
      "int64 index of the {} along axis (keepdim); ties: the FIRST index (NumPy/PyTorch); NaN counts as the "
      "{} (first NaN wins); no bool; no gradient",
      want_max ? "maximum" : "minimum", want_max ? "maximum" : "minimum");
  op.infer = [name](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_arg_reduce_dtype(name, in[0].dtype);
    int axis = misc_axis(attrs, in[0].shape.ndim(), name, std::nullopt);
    return std::vector<TensorMeta>{
        {arg_reduce_shape(in[0].shape, axis, attrs.get_bool("keepdim", false)), DType::I64}};
  };
  op.forward = [name, want_max](std::span<const Tensor> in, const Attrs& attrs) {
    int axis = misc_axis(attrs, in[0].ndim(), name, std::nullopt);
    bool keepdim = attrs.get_bool("keepdim", false);
    return std::vector<Tensor>{want_max ? argmax(in[0], axis, keepdim) : argmin(in[0], axis, keepdim)};
  };
  op.cases = arg_reduce_cases();
  registry.add(std::move(op));
}

void add_topk(OpRegistry& registry) {
  OpDef op;
  op.name = "topk";
  op.family = "misc";
  op.rule = rules_of<misc_rules>().topk;
  op.summary =
      "(values, indices i64): the k largest (largest=false: smallest) along axis (default -1); ties: the LOWER "
      "index first; NaN counts as the largest; sorted=false: the selected k in increasing index order; no bool. "
      "Gradient: dvalues scattered to the indices, zeros elsewhere (floats; integers take no gradient)";
  op.num_inputs = 1;
  op.num_outputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_topk_dtype(in[0].dtype);
    TopkArgs a = topk_args(attrs, in[0].shape);
    Shape out = in[0].shape;
    out[a.axis] = a.k;
    return std::vector<TensorMeta>{{out, in[0].dtype}, {out, DType::I64}};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    SW_CHECK(in[0].defined(), "topk: the input tensor is undefined");
    TopkResult r = topk(in[0], topk_args(attrs, in[0].shape()));
    return std::vector<Tensor>{r.values, r.indices};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    if (!is_floating(in[0].dtype())) return std::vector<Tensor>{Tensor()};
    int axis = misc_axis(attrs, in[0].ndim(), "topk", -1);
    return std::vector<Tensor>{topk_backward(in[0].shape(), dout[0], out[1], axis)};
  };
  op.cases = topk_cases();
  registry.add(std::move(op));
}

}  // namespace

void register_misc_ops(OpRegistry& registry) {
  add_dropout(registry);
  add_cumsum(registry);
  add_arg_reduce(registry, true);
  add_arg_reduce(registry, false);
  add_topk(registry);
}

}  // namespace shardwise::ops
