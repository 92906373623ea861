// SPMD rule of rotary_embedding(x [..., S, D], positions [S] or [B, S]), derived from its factor
// description (spmd/factor_rule.h): x and out share the labels "ab..", positions carry x's sequence
// letter (dim -2), and per-sequence positions [B, S] x's batch letter (dim 0) too, so a sharded
// batch or sequence keeps each row with its own global position: positions are resharded to x's
// layout of those dims (or x to positions' when only they shard one: x wins a conflict, as the
// first input). The head dim D is a replicated factor: rotate_half pairs element
// i with i + D/2, which a chunk of D does not hold. Every other dim (batch, heads) is kept.
// Partials (what the description cannot say):
//  forward  out is linear in x for fixed positions: x's P(sum|avg) passes to out; P(max|min) on x
//           and any Partial positions (integers whose parts mean nothing) are resharded to R.
//  reverse  a wanted P(sum|avg) is asked of x; other wanted Partials -> R.
//  grad     the kernel reads positions and dout (dx = dout rotated back), not x or out: dout's
//           P(sum|avg) passes to dx; positions take no gradient.
#include "shardwise/ops/rotary/rules.h"

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

constexpr size_t kX = 0, kDout = 3;  // among the grad inputs x, positions, out, dout

Factors describe(std::span<const TensorSpec> in, const Attrs&) {
  const int n = in[0].shape.ndim();
  const Shape &xs = in[0].shape, &ps = in[1].shape;
  const bool per_batch = ps.ndim() == 2 && n >= 3 && ps[0] == xs[0] && ps[1] == xs[n - 2];
  SW_CHECK(n >= 2 && ((ps.ndim() == 1 && ps[0] == xs[n - 2]) || per_batch),
           "rule 'rotary_embedding': x must be [..., S, D] and positions [S] or [x's dim 0, S], got x {} and "
           "positions {}",
           xs.to_string(), ps.to_string());
  const Labels x = labels_of_rank(n);
  Labels positions, head_dim;
  if (per_batch) positions.push(x.chars[0]);
  positions.push(x.chars[static_cast<size_t>(n - 2)]);
  head_dim.push(x.chars[static_cast<size_t>(n - 1)]);
  Factors f;
  f.add_input(x);
  f.add_input(positions);
  f.add_output(x, in[0].shape);
  f.replicated = head_dim;
  return f;
}

void forward_partials(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice) {
  if (!is_linear_partial(given[kX])) return;
  choice.operands[kX] = given[kX];
  choice.results[0] = given[kX];
}

void reverse_partials(std::span<const Placement> want, std::span<const TensorSpec>, const Attrs&,
                      PartialChoice& choice) {
  if (!is_linear_partial(want[0])) return;
  choice.operands[kX] = want[0];
  choice.results[0] = want[0];
}

void grad_partials(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                   PartialChoice& choice) {
  if (!is_linear_partial(given[kDout])) return;
  choice.operands[kDout] = given[kDout];
  choice.results[kX] = given[kDout];
}

}  // namespace

RotaryRules rotary_rules() {
  RotaryRules r;
  FactorRule rope;
  rope.name = "rotary_embedding";
  rope.summary =
      "x [.., S, D], positions [S] or [B, S], out like x: batch/head dims kept, S (and B) shared by x and positions "
      "(x wins), D "
      "replicated; x P(sum|avg) -> out P(same); other Partials -> R. Grad: reads positions, dout; dout P(sum|avg) "
      "-> dx P(same)";
  rope.num_inputs = 2;
  rope.describe = describe;
  rope.forward_partials = forward_partials;
  rope.reverse_partials = reverse_partials;
  rope.grad_partials = grad_partials;
  rope.grad_reads = 0b010;  // positions; not x, not the output
  rope.no_grad = 0b10;      // positions
  r.rotary_embedding = derive_rule(std::move(rope));
  return r;
}

}  // namespace shardwise::ops
