// SPMD rule of swiglu(gate, up) = silu(gate) * up, derived from its factor description
// (spmd/factor_rule.h): gate, up and out share the labels "ab.." (every dim kept, gate's sharding
// wins a conflict), so every Shard passes. What the description cannot say is the Partial table:
//  forward  out is linear in up for a fixed gate: up's P(sum|avg) passes to out where gate is
//           Replicate; any Partial gate (silu is not linear) and P(max|min) are resharded to R.
//  reverse  a wanted P(sum|avg) is asked of up (gate R); other wanted Partials -> R.
//  grad     the kernel reads gate, up and dout (not out). dgate = dout * up * silu'(gate) is linear
//           in dout and in up, dup = dout * silu(gate) in dout: dout's P(sum|avg) passes to both
//           (up R there); otherwise up's passes to dgate (dup is then exact and R).
#include "shardwise/ops/activation/rules.h"

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

constexpr size_t kUp = 1, kDout = 3;  // among the grad inputs gate, up, out, dout

Factors describe(std::span<const TensorSpec> in, const Attrs&) {
  SW_CHECK(in[0].shape == in[1].shape, "rule 'swiglu': gate {} and up {} must have the same shape",
           in[0].shape.to_string(), in[1].shape.to_string());
  const Labels all = labels_of_rank(in[0].shape.ndim());
  Factors f;
  f.add_input(all);
  f.add_input(all);
  f.add_output(all, in[0].shape);
  return f;
}

void forward_partials(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice) {
  if (!is_linear_partial(given[kUp])) return;
  choice.operands[kUp] = given[kUp];
  choice.results[0] = given[kUp];
}

void reverse_partials(std::span<const Placement> want, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice) {
  if (!is_linear_partial(want[0])) return;
  choice.operands[kUp] = want[0];
  choice.results[0] = want[0];
}

void grad_partials(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                   PartialChoice& choice) {
  if (is_linear_partial(given[kDout])) {
    choice.operands[kDout] = given[kDout];
    choice.results[0] = choice.results[1] = given[kDout];
  } else if (is_linear_partial(given[kUp])) {
    choice.operands[kUp] = given[kUp];
    choice.results[0] = given[kUp];
  }
}

}  // namespace

ActivationRules activation_rules() {
  ActivationRules r;
  FactorRule swiglu;
  swiglu.name = "swiglu";
  swiglu.summary =
      "gate, up, out share every dim (gate wins); up P(sum|avg) with gate R -> out P(same); other Partials "
      "-> R. Grad: reads gate, up, dout; dout P(sum|avg) -> dgate, dup P(same); else up P(sum|avg) -> dgate "
      "P(same)";
  swiglu.num_inputs = 2;
  swiglu.describe = describe;
  swiglu.forward_partials = forward_partials;
  swiglu.reverse_partials = reverse_partials;
  swiglu.grad_partials = grad_partials;
  swiglu.grad_reads = 0b011;  // gate and up; not the output
  r.swiglu = derive_rule(std::move(swiglu));
  return r;
}

}  // namespace shardwise::ops
