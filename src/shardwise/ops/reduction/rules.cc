// SPMD rules of the reductions (sum, mean, max, min, amax, amin, prod).
//
// Description: x is labelled "abc..", the output by x's kept letters (keepdim: '1' in place of a
// reduced dim, never sharded); the reduced letters are contracted factors. A mesh dim holds one
// placement per tensor, so each mesh dim is decided on its own:
//  - it shards a kept dim of x: kept, the output is sharded the same way;
//  - it shards a reduced dim of x: the local kernel reduces its block, and the output is
//    Partial on that mesh dim: sum -> P(sum), max/amax -> P(max), min/amin -> P(min) (empty
//    shards give the reduction's identity); mean -> P(avg) only when the mesh dims sharding that
//    axis split it into equal non-empty chunks (n divisible by the product of their sizes, kept
//    greedily in split order: the reduced letters are even factors), else that mesh dim is
//    resharded to Replicate; prod -> Replicate (there is no Partial(prod): its reduced letters
//    are replicated factors);
//  - x is Partial on it: sum/mean keep P(sum) and P(avg) (linear), max/amax keep P(max),
//    min/amin keep P(min); any other Partial is resharded to Replicate.
// Reverse: kept dims map back to x; a wanted Partial on mesh dim m is made by sharding a reduced
// axis on m when that yields it (x's own reduced axis on m if x shards one, else the first
// reduced axis; mean also needs equal chunks), else by a Partial x that passes through, else m is
// Replicate.
// Grad inputs: x, out, dout; output: dx, sharded like x.
//  - sum: dx = broadcast(dout): x's reduced axes may stay sharded; x's values are not read.
//  - mean: dx = dout / N with N the LOCAL reduced count, so x's reduced axes must be Replicate.
//  - max/min: dx = dout * (x == out): exact on any block of x as long as out is the global
//    extremum, so x's reduced axes may stay sharded while out and dout are Replicate there.
//  - amax/amin: dx = dout * (x == out) / count, the tie count over the WHOLE reduced extent:
//    x's reduced axes must be Replicate.
//  - prod: dx = dout * product of the others: x's reduced axes must be Replicate.
// (mean, amax, amin: the reduced letters are grad-replicated factors.)
// Kept dims: x, dout (and out where read) share one sharding (merged in that order, x first).
// On a mesh dim that shards nothing, dout's P(sum) / P(avg) passes to dx (x, out Replicate
// there) since dx is linear in dout; not for integer amax/amin (truncating division).
// x's values are not read by sum/mean and out is not read by sum/mean/prod: their Partials and
// (for out) whole distribution are left as given, no reshard.
// The three parts are derived from the description by spmd/factor_rule.h; this file gives the
// description and the Partial tables.
#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/ops/reduction/rules.h"
#include "shardwise/ops/reduction/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// The Partial a sharded reduced axis produces, if any.
bool reduced_axis_partial(ReduceKind kind, ReduceOp& op) {
  switch (kind) {
    case ReduceKind::Sum: op = ReduceOp::Sum; return true;
    case ReduceKind::Mean: op = ReduceOp::Avg; return true;
    case ReduceKind::Max:
    case ReduceKind::AMax: op = ReduceOp::Max; return true;
    case ReduceKind::Min:
    case ReduceKind::AMin: op = ReduceOp::Min; return true;
    case ReduceKind::Prod: return false;
  }
  return false;
}

// Whether a Partial(op) input gives a Partial(op) output: the reduction commutes with op.
bool partial_passes(ReduceKind kind, ReduceOp op) {
  switch (kind) {
    case ReduceKind::Sum:
    case ReduceKind::Mean: return op == ReduceOp::Sum || op == ReduceOp::Avg;
    case ReduceKind::Max:
    case ReduceKind::AMax: return op == ReduceOp::Max;
    case ReduceKind::Min:
    case ReduceKind::AMin: return op == ReduceOp::Min;
    case ReduceKind::Prod: return false;
  }
  return false;
}

bool is_extremum(ReduceKind kind) {
  return kind == ReduceKind::Max || kind == ReduceKind::Min || kind == ReduceKind::AMax || kind == ReduceKind::AMin;
}

// x "abc..", the output x's kept letters ('1' for a kept reduced dim); the reduced letters are
// contracted (replicated for prod, even for mean, grad-replicated where the gradient needs them whole).
Factors describe(ReduceKind kind, std::string_view name, std::span<const TensorSpec> in, const Attrs& attrs) {
  const Shape& shape = in[0].shape;
  const uint32_t mask = reduce_axes_mask(attrs, shape.ndim(), name);
  const bool keepdim = reduce_keepdim(attrs);
  Factors f;
  Labels x = labels_of_rank(shape.ndim()), out, reduced;
  for (int d = 0; d < shape.ndim(); ++d) {
    const char letter = x.chars[static_cast<size_t>(d)];
    if (!((mask >> d) & 1u)) {
      out.push(letter);
      continue;
    }
    reduced.push(letter);
    if (keepdim) out.push('1');
  }
  f.add_input(x);
  f.add_output(out, reduce_output_shape(shape, mask, keepdim));
  if (!reduced_axis_partial(kind, f.contraction)) f.replicated = reduced;
  if (kind == ReduceKind::Mean) f.even = reduced;
  if (kind == ReduceKind::Mean || kind == ReduceKind::AMax || kind == ReduceKind::AMin) f.grad_replicated = reduced;
  return f;
}

// `rule_name` must be a string literal: the rule parts keep a view of it for their messages.
Rule make_rule(ReduceKind kind, std::string_view rule_name, std::string summary) {
  FactorRule rule;
  rule.name = std::string(rule_name);
  rule.summary = std::move(summary);
  rule.describe = [kind, rule_name](std::span<const TensorSpec> in, const Attrs& attrs) {
    return describe(kind, rule_name, in, attrs);
  };
  // A Partial x that the reduction commutes with passes (forward: given; reverse: wanted).
  auto pass = [kind](std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                     PartialChoice& choice) {
    if (!given[0].is_partial() || !partial_passes(kind, given[0].reduce)) return;
    choice.operands[0] = given[0];
    choice.results[0] = given[0];
  };
  rule.forward_partials = pass;
  rule.reverse_partials = pass;
  const bool reads_x = kind != ReduceKind::Sum && kind != ReduceKind::Mean;
  rule.grad_partials = [kind, reads_x](std::span<const Placement> given, std::span<const TensorSpec> g,
                                       const Attrs&, PartialChoice& choice) {
    const bool linear = !((kind == ReduceKind::AMax || kind == ReduceKind::AMin) && !is_floating(g[2].dtype));
    if (linear && is_linear_partial(given[2])) {
      choice.operands[2] = given[2];
      choice.results[0] = given[2];
    }
    if (!reads_x && given[0].is_partial()) choice.operands[0] = given[0];
  };
  rule.grad_reads = is_extremum(kind) ? 0b11u : 0b01u;  // x's layout always; out for max/min only
  rule.grad_gradients_first = true;                      // x, dout, out
  return derive_rule(std::move(rule));
}

}  // namespace

ReductionRules reduction_rules() {
  ReductionRules r;
  r.reduce_sum = make_rule(ReduceKind::Sum, "reduce_sum",
           "kept dims keep their sharding; a sharded reduced axis gives P(sum) (empty shards add 0); P(sum)/P(avg) "
           "inputs pass through, other Partials -> R. Grad: dx = broadcast(dout) sharded like x (reduced axes may "
           "stay sharded), dout P(sum)/P(avg) -> dx same where x is not sharded");
  r.reduce_mean = make_rule(ReduceKind::Mean, "reduce_mean",
           "kept dims keep their sharding; a sharded reduced axis gives P(avg) only where its chunks are equal and "
           "non-empty (n % product of mesh sizes == 0), else that mesh dim -> R; P(sum)/P(avg) inputs pass through, "
           "other Partials -> R. Grad: reduced axes of x -> R (the local count must be global), dout P(sum)/P(avg) "
           "-> dx same");
  r.reduce_max = make_rule(ReduceKind::Max, "reduce_max",
           "kept dims keep their sharding; a sharded reduced axis gives P(max) (empty shards give -inf/lowest); "
           "P(max) inputs pass through, other Partials -> R. Grad: dx = dout * (x == out), every tie gets the full "
           "dout; x may stay sharded on reduced axes, out and dout -> R there; dout P(sum)/P(avg) -> dx same");
  r.reduce_min = make_rule(ReduceKind::Min, "reduce_min",
           "kept dims keep their sharding; a sharded reduced axis gives P(min) (empty shards give +inf/highest); "
           "P(min) inputs pass through, other Partials -> R. Grad: dx = dout * (x == out), every tie gets the full "
           "dout; x may stay sharded on reduced axes, out and dout -> R there; dout P(sum)/P(avg) -> dx same");
  r.reduce_amax = make_rule(ReduceKind::AMax, "reduce_amax",
           "forward as reduce_max (sharded reduced axis -> P(max), P(max) passes). Grad: dx = dout * (x == out) / "
           "tie count over the whole reduced extent, so x's reduced axes -> R; dout P(sum)/P(avg) -> dx same "
           "(floats only: integer division is not linear)");
  r.reduce_amin = make_rule(ReduceKind::AMin, "reduce_amin",
           "forward as reduce_min (sharded reduced axis -> P(min), P(min) passes). Grad: dx = dout * (x == out) / "
           "tie count over the whole reduced extent, so x's reduced axes -> R; dout P(sum)/P(avg) -> dx same "
           "(floats only: integer division is not linear)");
  r.reduce_prod = make_rule(ReduceKind::Prod, "reduce_prod",
           "kept dims keep their sharding; reduced axes -> R (there is no Partial(prod)); every Partial input -> R. "
           "Grad: dx = dout * product of the others, reduced axes and Partials of x -> R; dout P(sum)/P(avg) -> dx "
           "same");
  return r;
}

}  // namespace shardwise::ops
