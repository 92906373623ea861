// SPMD rules of the unary elementwise ops.
//
// Every unary op maps each element on its own, so a Shard placement always passes through
// unchanged (co-shard order kept). What differs between the rules is which Partial placements
// pass: out = f(x) is Partial(r') where x is Partial(r) only when f(reduce_r(parts)) equals
// reduce_r'(f(parts)) for ANY parts, and a Partial mesh dim is resharded to Replicate otherwise.
//  - elementwise_unary (non-linear ops): no Partial passes.
//  - elementwise_unary_monotone (non-decreasing ops: exp, tanh, sigmoid, relu, sign):
//    P(max) -> P(max), P(min) -> P(min) (a non-decreasing f commutes with max and min).
//  - neg: floats: P(sum) -> P(sum), P(avg) -> P(avg), P(max) -> P(min), P(min) -> P(max);
//    integers: P(sum) -> P(sum) only (wraparound makes -INT_MIN == INT_MIN, so max/min do not
//    swap exactly, and an integer average is not a linear function of wrapped parts).
//  - scale (out = s x + b_eff, b_eff = bias, or s * bias when bias_after_scale = false):
//    floats: P(avg) passes (the average of affine images is the affine image of the average);
//    P(sum) passes when b_eff == 0; P(max)/P(min) pass when s >= 0 and swap when s < 0.
//    integers (wraparound): P(sum) passes when b_eff == 0; P(max)/P(min) only when s == 0.
//  - cast: same dtype: everything passes; float -> float of no more precision (f64 -> f32,
//    f32 -> f16/bf16, ...): everything passes (within the target's rounding); other
//    non-decreasing casts (widening float casts, int/bool -> float, float -> int which truncates
//    and saturates, int -> an int type holding its whole range, bool -> int) pass P(max)/P(min);
//    the rest need Replicate (a partial sum cast to an integer is not the sum of the cast parts,
//    and f32 parts summed in f64 are not the f32 sum widened).
// Reverse rules map the wanted output Partial back through the same table (neg of a wanted
// P(max) needs input P(min)); an output Partial that no input Partial produces becomes Replicate.
// Gradient rules: see GradKind below. The three parts are derived from the labels "ab.." (every dim
// kept) by spmd/factor_rule.h; this file gives the Partial tables.
#include <array>
#include <optional>
#include <variant>

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/ops/unary/rules.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// Which Partial placements an elementwise map keeps: to[r] is the reduce op of the output when
// the input is Partial(r), or -1 when the input must be Replicate there.
struct PartialMap {
  std::array<int8_t, 4> to{-1, -1, -1, -1};

  void pass(ReduceOp from, ReduceOp into) { to[static_cast<size_t>(from)] = static_cast<int8_t>(into); }
  std::optional<ReduceOp> forward(ReduceOp from) const {
    int8_t t = to[static_cast<size_t>(from)];
    if (t < 0) return std::nullopt;
    return static_cast<ReduceOp>(t);
  }
  // The input reduce op whose image is `wanted`.
  std::optional<ReduceOp> inverse(ReduceOp wanted) const {
    for (size_t r = 0; r < to.size(); ++r) {
      if (to[r] == static_cast<int8_t>(wanted)) return static_cast<ReduceOp>(r);
    }
    return std::nullopt;
  }
};

PartialMap map_none() { return {}; }

PartialMap map_identity() {
  PartialMap m;
  for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) m.pass(r, r);
  return m;
}

PartialMap map_monotone() {
  PartialMap m;
  m.pass(ReduceOp::Max, ReduceOp::Max);
  m.pass(ReduceOp::Min, ReduceOp::Min);
  return m;
}

// x -> s * x + b (s, b already effective), on values of `dtype`.
PartialMap map_affine(DType dtype, double s, double b) {
  PartialMap m;
  if (b == 0) m.pass(ReduceOp::Sum, ReduceOp::Sum);
  if (is_floating(dtype)) {
    m.pass(ReduceOp::Avg, ReduceOp::Avg);
    bool swap = s < 0;
    m.pass(ReduceOp::Max, swap ? ReduceOp::Min : ReduceOp::Max);
    m.pass(ReduceOp::Min, swap ? ReduceOp::Max : ReduceOp::Min);
  } else if (s == 0) {  // a constant: every rank holds b
    m.pass(ReduceOp::Max, ReduceOp::Max);
    m.pass(ReduceOp::Min, ReduceOp::Min);
  }
  return m;
}

// The [lowest, max] range of an integer or bool dtype, to decide whether a cast can wrap.
std::pair<double, double> int_range(DType d) {
  switch (d) {
    case DType::I64: return {-9223372036854775808.0, 9223372036854775807.0};
    case DType::I32: return {-2147483648.0, 2147483647.0};
    case DType::I8: return {-128.0, 127.0};
    case DType::U8: return {0.0, 255.0};
    default: return {0.0, 1.0};  // bool
  }
}

// Significand bits, to tell a widening float cast from a narrowing one.
int float_precision(DType d) {
  switch (d) {
    case DType::F64: return 53;
    case DType::F32: return 24;
    case DType::F16: return 11;
    default: return 8;  // bf16
  }
}

PartialMap map_cast(DType src, DType dst) {
  if (src == dst) return map_identity();
  // A float partial sum/avg holds parts whose low-precision sum is the value: summing them after
  // a widening cast gives a different (more precise) number than widening the sum, so only a
  // cast to no more precision passes P(sum)/P(avg) (within the narrower type's rounding).
  if (is_floating(src) && is_floating(dst) && float_precision(dst) <= float_precision(src)) return map_identity();
  bool monotone;
  if (dst == DType::Bool) {
    monotone = false;  // x != 0 folds negatives onto true
  } else if (is_floating(dst) || is_floating(src)) {
    monotone = true;  // rounding to a float, or truncating + saturating to an integer
  } else {
    auto [slo, shi] = int_range(src);
    auto [dlo, dhi] = int_range(dst);
    monotone = dlo <= slo && shi <= dhi;  // no wraparound
  }
  return monotone ? map_monotone() : map_none();
}

// The dtype named by a cast's "dtype" attribute (read without copying the string).
DType cast_target(const Attrs& attrs) {
  const AttrValue* v = attrs.find("dtype");
  const std::string* name = v ? std::get_if<std::string>(v) : nullptr;
  SW_CHECK(name != nullptr, "cast: attribute dtype (a dtype name such as \"f32\") is required, got '{}'",
           attrs.to_string());
  return parse_dtype(*name);
}

struct ScaleArgs {
  double s, b_eff;
};
ScaleArgs scale_args(const Attrs& attrs) {
  double s = attrs.get_float("scale", 1.0);
  double b = attrs.get_float("bias", 0.0);
  return {s, attrs.get_bool("bias_after_scale", true) ? b : s * b};
}

// The map's image of a Partial `p` (operand keeps p, result the image), or nothing (both R).
void apply(const PartialMap& map, const Placement& p, PartialChoice& choice) {
  if (!p.is_partial()) return;
  if (auto r = map.forward(p.reduce)) {
    choice.operands[0] = p;
    choice.results[0] = Placement::partial(*r);
  }
}

enum class GradKind {
  NonLinear,  // dx = dy * f'(x): x, out and dy merged (order x, out, dy); dy's Partial through the map
  Linear,     // dx = L(dy) (neg, scale, cast): x and out not read (kept as given); dy's Partial mapped
};

// A rule whose Partial table depends only on the input dtype and the attributes; the gradient's
// table (`grad_map`) on the grad inputs (x, out, dy) and the attributes.
template <class MapFn, class GradMapFn>
Rule make_rule(std::string name, std::string summary, MapFn map_of, GradKind kind, GradMapFn grad_map) {
  FactorRule rule;
  rule.name = std::move(name);
  rule.summary = std::move(summary);
  rule.describe = [map_of](std::span<const TensorSpec> in, const Attrs& attrs) {
    map_of(in[0].dtype, attrs);  // reads (and so checks) the attributes, as every part does
    Factors f;
    f.add_input(labels_of_rank(in[0].shape.ndim()));
    f.add_output(labels_of_rank(in[0].shape.ndim()), in[0].shape);
    return f;
  };
  rule.forward_partials = [map_of](std::span<const Placement> given, std::span<const TensorSpec> in,
                                   const Attrs& attrs, PartialChoice& choice) {
    apply(map_of(in[0].dtype, attrs), given[0], choice);
  };
  // A wanted output Partial is asked of the input through the inverse map (neg: P(max) <- P(min)).
  rule.reverse_partials = [map_of](std::span<const Placement> want, std::span<const TensorSpec> in,
                                   const Attrs& attrs, PartialChoice& choice) {
    if (auto r = map_of(in[0].dtype, attrs).inverse(want[0].reduce)) {
      choice.operands[0] = Placement::partial(*r);
      choice.results[0] = want[0];
    }
  };
  rule.grad_partials = [grad_map](std::span<const Placement> given, std::span<const TensorSpec> g,
                                  const Attrs& attrs, PartialChoice& choice) {
    PartialChoice dy;
    apply(grad_map(g, attrs), given[2], dy);
    choice.operands[2] = dy.operands[0];
    choice.results[0] = dy.results[0];
  };
  rule.grad_reads = kind == GradKind::NonLinear ? 0b11u : 0u;
  return derive_rule(std::move(rule));
}

}  // namespace

UnaryRules unary_rules() {
  UnaryRules r;
  r.elementwise_unary = make_rule(
      "elementwise_unary",
      "non-linear unary op: Shard passes (co-shard order kept); Partial -> Replicate first, output R "
      "there. grad: x, out, dy merged einsum-style; dy P(sum|avg) -> dx P(sum|avg) with x, out R "
      "there; other Partial -> R",
      [](DType, const Attrs&) { return map_none(); }, GradKind::NonLinear,
      [](std::span<const TensorSpec>, const Attrs&) {
        PartialMap linear;  // dx = dy * f'(x) is linear in dy
        linear.pass(ReduceOp::Sum, ReduceOp::Sum);
        linear.pass(ReduceOp::Avg, ReduceOp::Avg);
        return linear;
      });
  r.elementwise_unary_monotone = make_rule(
      "elementwise_unary_monotone",
      "non-decreasing unary op: Shard passes; P(max) -> P(max), P(min) -> P(min); P(sum|avg) -> "
      "Replicate first. grad: x, out, dy merged einsum-style; every dy Partial passes to dx (f' >= 0) "
      "with x, out R there",
      [](DType, const Attrs&) { return map_monotone(); }, GradKind::NonLinear,
      // dx = dy * c with c = f'(x) >= 0 and replicated: linear and non-decreasing in dy.
      [](std::span<const TensorSpec>, const Attrs&) { return map_identity(); });
  r.neg = make_rule(
      "neg",
      "neg: Shard passes; floats: P(sum) -> P(sum), P(avg) -> P(avg), P(max) <-> P(min); integers: "
      "P(sum) -> P(sum), other Partial -> R. grad: dx = -dy, same table on dy; x, out untouched",
      [](DType dtype, const Attrs&) { return map_affine(dtype, -1.0, 0.0); }, GradKind::Linear,
      [](std::span<const TensorSpec> g, const Attrs&) { return map_affine(g[2].dtype, -1.0, 0.0); });
  r.scale = make_rule(
      "scale",
      "scale (s x + b, b_eff = b or s b): Shard passes; floats: P(avg) passes, P(sum) iff b_eff == 0, "
      "P(max|min) pass if s >= 0, swap if s < 0; integers: P(sum) iff b_eff == 0, P(max|min) iff "
      "s == 0; else R. grad: dx = s dy, same table with b = 0; x, out untouched",
      [](DType dtype, const Attrs& attrs) {
        ScaleArgs a = scale_args(attrs);
        return map_affine(dtype, a.s, a.b_eff);
      },
      GradKind::Linear,
      [](std::span<const TensorSpec> g, const Attrs& attrs) {
        return map_affine(g[2].dtype, scale_args(attrs).s, 0.0);
      });
  r.cast = make_rule(
      "cast",
      "cast: Shard passes; same dtype or float -> float of no more precision: every Partial passes; "
      "other non-decreasing casts (widening float, int/bool -> float, float -> int, widening int): "
      "P(max|min) pass; else R. grad: dx = cast(dy) back, same table; x, out untouched",
      [](DType dtype, const Attrs& attrs) { return map_cast(dtype, cast_target(attrs)); }, GradKind::Linear,
      // An integer or bool input takes no gradient; the table then only shapes an unused dx.
      [](std::span<const TensorSpec> g, const Attrs&) { return map_cast(g[2].dtype, g[0].dtype); });
  return r;
}

}  // namespace shardwise::ops
