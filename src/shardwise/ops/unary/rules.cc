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
// Gradient rules: see grad_nonlinear and grad_linear below.
#include <array>
#include <optional>
#include <variant>

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
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

// Forward: the input's placements with its Partial mesh dims either mapped or made Replicate.
SpmdResult forward_with(const ProcessMesh& mesh, const TensorSpec& x, const PartialMap& map) {
  DistAttr in = x.dist, out = x.dist;
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = x.dist[m];
    if (!p.is_partial()) continue;
    if (auto r = map.forward(p.reduce)) {
      out.set(m, Placement::partial(*r));
    } else {
      in.set(m, Placement::replicate());
      out.set(m, Placement::replicate());
    }
  }
  return {{in}, {out}};
}

// Reverse: the wanted output placements, each wanted Partial mapped back to the input's.
SpmdResult reverse_with(const ProcessMesh& mesh, const TensorSpec& wanted, const PartialMap& map) {
  DistAttr in = wanted.dist, out = wanted.dist;
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = wanted.dist[m];
    if (!p.is_partial()) continue;
    if (auto r = map.inverse(p.reduce)) {
      in.set(m, Placement::partial(*r));
    } else {
      in.set(m, Placement::replicate());
      out.set(m, Placement::replicate());
    }
  }
  return {{in}, {out}};
}

void check_grad_shapes(std::string_view rule, std::span<const TensorSpec> g) {
  SW_CHECK(g[0].shape == g[1].shape && g[0].shape == g[2].shape,
           "rule '{}' grad: x {}, out {} and out_grad {} must have the same shape", rule,
           g[0].shape.to_string(), g[1].shape.to_string(), g[2].shape.to_string());
}

// Gradient of a non-linear op, dx = dy * f'(x): x, out and dy are merged with the einsum helper
// (same letters; the first tensor sharding a dim wins, in the order x, out, dy). On a mesh dim no
// letter is sharded on, dy's Partial passes to dx through `dmap` (dx is linear in dy once x and
// out are replicated, so x and out are required Replicate there); anything else is Replicate.
SpmdResult grad_nonlinear(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> g,
                          const PartialMap& dmap) {
  check_inputs(rule, mesh, g, 3);
  check_grad_shapes(rule, g);
  std::string_view letters = axis_letters(g[0].shape.ndim());
  AxisMap axes = merge_axes({letters, letters, letters}, {g[0].dist, g[1].dist, g[2].dist});
  DistAttr sharded = dist_from_axes(letters, axes, mesh.ndim());
  DistAttr dy = sharded, dx = sharded;
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = g[2].dist[m];
    if (!sharded[m].is_replicate() || !p.is_partial()) continue;
    if (auto r = dmap.forward(p.reduce)) {
      dy.set(m, p);
      dx.set(m, Placement::partial(*r));
    }
  }
  return {{sharded, sharded, dy}, {dx}};
}

// Gradient of a linear op, dx = L(dy) (neg, scale, cast): x and out are not read, so they keep
// their given distributions (no reshard); dx is dy's distribution mapped like the forward rule
// maps x's (dy's Partial dims that L does not keep exactly become Replicate).
SpmdResult grad_linear(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> g,
                       const PartialMap& dmap) {
  check_inputs(rule, mesh, g, 3);
  check_grad_shapes(rule, g);
  SpmdResult fwd = forward_with(mesh, g[2], dmap);
  return {{g[0].dist, g[1].dist, fwd.inputs[0]}, {fwd.outputs[0]}};
}

// A rule whose Partial table depends only on the input dtype and the attributes.
template <class MapFn, class GradFn>
Rule make_rule(std::string name, std::string summary, MapFn map_of, GradFn grad) {
  Rule r;
  r.name = name;
  r.summary = std::move(summary);
  r.forward = [name, map_of](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
    check_inputs(name, mesh, in, 1);
    return forward_with(mesh, in[0], map_of(in[0].dtype, attrs));
  };
  r.reverse = [name, map_of](const ProcessMesh& mesh, std::span<const TensorSpec> in,
                             std::span<const TensorSpec> out, const Attrs& attrs) {
    check_inputs(name, mesh, in, 1);
    check_inputs(name, mesh, out, 1);
    return reverse_with(mesh, out[0], map_of(in[0].dtype, attrs));
  };
  r.grad = [name, grad](const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
    return grad(name, mesh, g, attrs);
  };
  return r;
}

}  // namespace

UnaryRules unary_rules() {
  UnaryRules r;
  r.elementwise_unary = make_rule(
      "elementwise_unary",
      "non-linear unary op: Shard passes (co-shard order kept); Partial -> Replicate first, output R "
      "there. grad: x, out, dy merged einsum-style; dy P(sum|avg) -> dx P(sum|avg) with x, out R "
      "there; other Partial -> R",
      [](DType, const Attrs&) { return map_none(); },
      [](std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
        PartialMap linear;  // dx = dy * f'(x) is linear in dy
        linear.pass(ReduceOp::Sum, ReduceOp::Sum);
        linear.pass(ReduceOp::Avg, ReduceOp::Avg);
        return grad_nonlinear(name, mesh, g, linear);
      });
  r.elementwise_unary_monotone = make_rule(
      "elementwise_unary_monotone",
      "non-decreasing unary op: Shard passes; P(max) -> P(max), P(min) -> P(min); P(sum|avg) -> "
      "Replicate first. grad: x, out, dy merged einsum-style; every dy Partial passes to dx (f' >= 0) "
      "with x, out R there",
      [](DType, const Attrs&) { return map_monotone(); },
      [](std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
        // dx = dy * c with c = f'(x) >= 0 and replicated: linear and non-decreasing in dy.
        return grad_nonlinear(name, mesh, g, map_identity());
      });
  r.neg = make_rule(
      "neg",
      "neg: Shard passes; floats: P(sum) -> P(sum), P(avg) -> P(avg), P(max) <-> P(min); integers: "
      "P(sum) -> P(sum), other Partial -> R. grad: dx = -dy, same table on dy; x, out untouched",
      [](DType dtype, const Attrs&) { return map_affine(dtype, -1.0, 0.0); },
      [](std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
        return grad_linear(name, mesh, g, map_affine(g[2].dtype, -1.0, 0.0));
      });
  r.scale = make_rule(
      "scale",
      "scale (s x + b, b_eff = b or s b): Shard passes; floats: P(avg) passes, P(sum) iff b_eff == 0, "
      "P(max|min) pass if s >= 0, swap if s < 0; integers: P(sum) iff b_eff == 0, P(max|min) iff "
      "s == 0; else R. grad: dx = s dy, same table with b = 0; x, out untouched",
      [](DType dtype, const Attrs& attrs) {
        ScaleArgs a = scale_args(attrs);
        return map_affine(dtype, a.s, a.b_eff);
      },
      [](std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
        return grad_linear(name, mesh, g, map_affine(g[2].dtype, scale_args(attrs).s, 0.0));
      });
  r.cast = make_rule(
      "cast",
      "cast: Shard passes; same dtype or float -> float of no more precision: every Partial passes; "
      "other non-decreasing casts (widening float, int/bool -> float, float -> int, widening int): "
      "P(max|min) pass; else R. grad: dx = cast(dy) back, same table; x, out untouched",
      [](DType dtype, const Attrs& attrs) { return map_cast(dtype, cast_target(attrs)); },
      [](std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
        // An integer or bool input takes no gradient; the table then only shapes an unused dx.
        return grad_linear(name, mesh, g, map_cast(g[2].dtype, g[0].dtype));
      });
  return r;
}

}  // namespace shardwise::ops
