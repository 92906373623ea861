// The reduction ops: sum, mean, max, min, amax, amin, prod (kernels in kernels.h, rules in
// rules.cc). Attributes: axis (int list, negative allowed, duplicates are an Error;
// absent or empty = every dim), keepdim (bool, default false).
#include "shardwise/core/error.h"
#include "shardwise/ops/families.h"
#include "shardwise/ops/reduction/rules.h"
#include "shardwise/ops/reduction/kernels.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;

Attrs axis_attrs(std::vector<int64_t> axis, bool keepdim) {
  Attrs a;
  if (!axis.empty()) a.set("axis", std::move(axis));
  if (keepdim) a.set("keepdim", true);
  return a;
}

VerifyCase one(Shape shape, DType dtype, Attrs attrs, ValueGen gen = {}) {
  return VerifyCase{{shape}, {dtype}, std::move(attrs), {gen}};
}

// Shapes: 12 divides every test mesh (12x6 every mesh dim), 5x7 does not, 2x5 / 1x6 leave some shards empty on a
// mesh dim of 3, 4x3x5 reduces several axes. Extremum ops draw small integers in some cases so
// that ties are frequent (what proves the tie semantics across shards); prod draws values near 1
// so it stays finite, plus a case with zeros.
std::vector<VerifyCase> cases_for(ReduceKind kind) {
  const DType f64 = DType::F64, f32 = DType::F32, i64 = DType::I64, i32 = DType::I32;
  bool extremum = kind == ReduceKind::Max || kind == ReduceKind::Min || kind == ReduceKind::AMax ||
                  kind == ReduceKind::AMin;
  ValueGen gen{};
  if (kind == ReduceKind::Prod) gen = {Kind::Uniform, 0.5, 1.5};
  ValueGen ties{Kind::SmallInts, -2, 2};
  ValueGen fgen = extremum ? ties : gen;  // f64 cases with ties for the extremum ops
  std::vector<VerifyCase> cases = {
      one({12}, f64, axis_attrs({0}, true), fgen),  // even on every test mesh, co-sharding included
      one({12, 6}, f64, axis_attrs({0}, false), gen),
      one({12, 6}, f64, axis_attrs({1}, true), fgen),
      one({5, 7}, f64, axis_attrs({-1}, false), fgen),
      one({5, 7}, f64, axis_attrs({}, false), gen),
      one({2, 5}, f64, axis_attrs({0, 1}, true), fgen),
      one({1, 6}, f64, axis_attrs({0}, false), gen),
      one({4, 3, 5}, f64, axis_attrs({0, 2}, false), fgen),
      one({4, 3, 5}, f64, axis_attrs({1}, true), gen),
      one({5, 7}, f32, axis_attrs({0}, false), gen),
  };
  if (kind == ReduceKind::Prod) {
    cases.push_back(one({5, 7}, f64, axis_attrs({1}, false), {Kind::SmallInts, -1, 1}));  // zeros
    cases.push_back(one({12, 6}, i64, axis_attrs({1}, false), {Kind::SmallInts, -2, 2}));
    cases.push_back(one({2, 5}, i32, axis_attrs({}, false), {Kind::SmallInts, -2, 2}));
  } else if (kind != ReduceKind::Mean) {
    ValueGen ints = extremum ? ties : ValueGen{Kind::Uniform, -9, 9};
    cases.push_back(one({12, 6}, i64, axis_attrs({0}, false), ints));
    cases.push_back(one({5, 7}, i32, axis_attrs({}, true), ints));
    cases.push_back(one({4, 3, 5}, i64, axis_attrs({2, 0}, false), ints));
  }
  return cases;
}

void add_op(OpRegistry& registry, ReduceKind kind, spmd::Rule ReductionRules::*rule, std::string summary) {
  OpDef op;
  op.name = std::string(reduce_kind_name(kind));
  op.family = "reduction";
  op.rule = rules_of<reduction_rules>().*rule;
  op.summary = std::move(summary);
  op.infer = [kind](std::span<const TensorMeta> in, const Attrs& attrs) {
    const TensorMeta& x = in[0];
    check_reduce_dtype(kind, x.dtype);
    uint32_t mask = reduce_axes_mask(attrs, x.shape.ndim(), reduce_kind_name(kind));
    return std::vector<TensorMeta>{{reduce_output_shape(x.shape, mask, reduce_keepdim(attrs)), x.dtype}};
  };
  op.forward = [kind](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{reduce(kind, in[0], attrs)};
  };
  op.backward = [kind](std::span<const Tensor> in, std::span<const Tensor> out, std::span<const Tensor> dout,
                       const Attrs& attrs) {
    return std::vector<Tensor>{reduce_backward(kind, in[0], out[0], dout[0], attrs)};
  };
  op.cases = cases_for(kind);
  registry.add(std::move(op));
}

}  // namespace

void register_reduction_ops(OpRegistry& registry) {
  add_op(registry, ReduceKind::Sum, &ReductionRules::reduce_sum,
         "sum over axis (all dims when absent/empty), keepdim; integers exact (wrapping), floats accumulate in "
         "double; empty extent -> 0. Gradient: dout broadcast");
  add_op(registry, ReduceKind::Mean, &ReductionRules::reduce_mean,
         "mean over axis, keepdim; floating dtypes only; empty extent -> NaN. Gradient: dout / N broadcast");
  add_op(registry, ReduceKind::Max, &ReductionRules::reduce_max,
         "max over axis, keepdim; empty extent -> -inf (lowest integer); NaN propagates. Gradient (ties): the full "
         "dout goes to EVERY position equal to the max (PaddlePaddle's max)");
  add_op(registry, ReduceKind::Min, &ReductionRules::reduce_min,
         "min over axis, keepdim; empty extent -> +inf (highest integer); NaN propagates. Gradient (ties): the full "
         "dout goes to EVERY position equal to the min (PaddlePaddle's min)");
  add_op(registry, ReduceKind::AMax, &ReductionRules::reduce_amax,
         "max over axis, keepdim (same values as max). Gradient (ties): dout is split EVENLY among the positions "
         "equal to the max, dout / count (PaddlePaddle's amax; integers: truncating division)");
  add_op(registry, ReduceKind::AMin, &ReductionRules::reduce_amin,
         "min over axis, keepdim (same values as min). Gradient (ties): dout is split EVENLY among the positions "
         "equal to the min, dout / count (PaddlePaddle's amin; integers: truncating division)");
  add_op(registry, ReduceKind::Prod, &ReductionRules::reduce_prod,
         "product over axis, keepdim; integers exact (wrapping), floats accumulate in double; empty extent -> 1. "
         "Gradient: dout * product of the other elements (exact with zeros, no division)");
}

}  // namespace shardwise::ops
