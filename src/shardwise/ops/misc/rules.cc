// SPMD rules of the misc ops: dropout, cumsum, argmax / argmin (arg_reduce), topk.
//
// x is labelled "abc..", and the einsum helper (merge_axes / dist_from_axes) keeps every Shard
// it can; the letter of the op's axis (cumsum, arg_reduce, topk) is never sharded.
//  - dropout: every Shard passes: the mask is keyed by the GLOBAL element index (the kernel reads
//    its block's offset from the KernelContext), so every shard draws exactly the single-device
//    mask. out = x * c with c = mask / (1 - p) >= 0 fixed per element, so every Partial of x
//    passes to out (linear: sum, avg; non-decreasing: max, min). The mask follows x's shards and
//    is Replicate where x is Partial (every rank of that mesh dim draws the same mask).
//    Grad (x, out, mask, dout, dmask -> dx): dx = dout * c, linear and non-decreasing in dout:
//    x, dout, mask merged in that order (dx follows x's sharding); on a mesh dim no letter
//    shards, every Partial of dout passes to dx (mask R there). x and out are not read: left as
//    given. dmask (the grad of an integer output, which no real program produces) is ignored and
//    reported laid out like the mask.
//  - cumsum: the cumsum axis -> R (a prefix sum needs the whole axis); other dims pass; P(sum),
//    P(avg) pass (linear); P(max), P(min) -> R. Grad (x, out, dout -> dx): dx = reverse cumsum of
//    dout: x, dout merged with the axis R, dout's P(sum|avg) passes on free mesh dims; x and out
//    are not read: left as given.
//  - arg_reduce (argmax, argmin): the reduced axis -> R (local indices are not global indices and
//    there is no Partial(argmax)); other dims pass, renumbered like a reduction (keepdim: '1' in
//    place of the axis); every Partial -> R. No gradient: the grad rule leaves its inputs as given
//    and reports dx as R.
//  - topk: the topk axis -> R; other dims pass; values and indices take x's sharding; every
//    Partial -> R. Grad (x, values, indices, dvalues, dindices -> dx): dx = zeros with dvalues
//    scattered at indices: x (its local shape sizes dx), indices and dvalues are merged in that
//    order with the axis R; on a mesh dim no letter shards, every Partial of dvalues passes to dx
//    (each element of dx is one dvalue or a constant 0 on every rank), and x's Partial is kept
//    (its values are not read); values is not read: left as given; dindices (the grad of an
//    integer output) is ignored and reported laid out like indices.
// Reverse rules: the wanted outputs (first output first) are merged into x's layout, wanted
// Partials kept only where the op makes them (dropout: out's Partial, cumsum: linear ones).
// The parts are derived by spmd/factor_rule.h from one description per rule (x "abc..", the
// outputs x's letters, the op's axis a replicated factor) and the Partial tables here; only
// arg_reduce's grad part (no gradient: inputs left as given) is hand-written.
#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/ops/misc/rules.h"
#include "shardwise/ops/misc/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

using Describe = Factors (*)(std::span<const TensorSpec>, const Attrs&);

// x "abc.." and `n_out` outputs with x's letters and shape (`out_shape`, if given), the op's axis
// (if any) a replicated factor.
Factors same_letters(const TensorSpec& x, int n_out, int axis, const Shape& out_shape) {
  Factors f;
  f.add_input(labels_of_rank(x.shape.ndim()));
  for (int o = 0; o < n_out; ++o) f.add_output(f.inputs[0], out_shape);
  if (axis >= 0) f.replicated.push(f.inputs[0].chars[static_cast<size_t>(axis)]);
  return f;
}

Factors dropout_describe(std::span<const TensorSpec> in, const Attrs&) {
  return same_letters(in[0], 2, -1, in[0].shape);  // out, mask
}

Factors cumsum_describe(std::span<const TensorSpec> in, const Attrs& attrs) {
  return same_letters(in[0], 1, misc_axis(attrs, in[0].shape.ndim(), "cumsum", std::nullopt), in[0].shape);
}

// The output: x's letters without the axis (keepdim: '1' in its place).
Factors arg_describe(std::span<const TensorSpec> in, const Attrs& attrs) {
  const Shape& shape = in[0].shape;
  const int axis = misc_axis(attrs, shape.ndim(), "arg_reduce", std::nullopt);
  const bool keepdim = attrs.get_bool("keepdim", false);
  Factors f;
  f.add_input(labels_of_rank(shape.ndim()));
  Labels out;
  for (int d = 0; d < shape.ndim(); ++d) {
    if (d != axis) out.push(f.inputs[0].chars[static_cast<size_t>(d)]);
    else if (keepdim) out.push('1');
  }
  f.add_output(out, arg_reduce_shape(shape, axis, keepdim));
  f.replicated.push(f.inputs[0].chars[static_cast<size_t>(axis)]);
  return f;
}

Factors topk_describe(std::span<const TensorSpec> in, const Attrs& attrs) {
  const TopkArgs a = topk_args(attrs, in[0].shape);
  Shape out = in[0].shape;
  out[a.axis] = a.k;
  return same_letters(in[0], 2, a.axis, out);  // values, indices
}

void no_partials(std::span<const Placement>, std::span<const TensorSpec>, const Attrs&, PartialChoice&) {}

// Operand `from`'s Partial (linear ones only, or any) is kept and passes to result 0.
template <size_t from, bool linear_only>
void pass_partial(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                  PartialChoice& choice) {
  const Placement& p = given[from];
  if (!p.is_partial() || (linear_only && !is_linear_partial(p))) return;
  choice.operands[from] = p;
  choice.results[0] = p;
}

// topk's grad: every Partial of dvalues passes to dx, x keeps its Partial (values not read).
void topk_grad_partials(std::span<const Placement> given, std::span<const TensorSpec> g, const Attrs& attrs,
                        PartialChoice& choice) {
  pass_partial<3, false>(given, g, attrs, choice);
  if (given[0].is_partial()) choice.operands[0] = given[0];
}

FactorRule rule_of(std::string name, std::string summary, Describe describe) {
  FactorRule r;
  r.name = std::move(name);
  r.summary = std::move(summary);
  r.describe = describe;
  r.forward_partials = no_partials;
  r.reverse_partials = no_partials;
  r.grad_partials = no_partials;
  return r;
}

// argmax / argmin take no gradient: the grad part leaves its inputs as given and reports dx R.
SpmdResult arg_grad(const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs&) {
  check_inputs("arg_reduce", mesh, g, 3);
  return {{g[0].dist, g[1].dist, g[2].dist}, {DistAttr(mesh.ndim())}};
}

}  // namespace

MiscRules misc_rules() {
  MiscRules r;
  FactorRule dropout = rule_of("dropout",
                    "every Shard passes (the mask is keyed by the global element index); every Partial of x "
                    "passes to out (out = x * c, c >= 0 per element); mask follows x's shards, R where x is "
                    "Partial. grad: x, dout, mask merged; dout's every Partial passes to dx on free mesh dims",
                    dropout_describe);
  dropout.forward_partials = pass_partial<0, false>;
  dropout.reverse_partials = pass_partial<0, false>;
  dropout.grad_partials = pass_partial<3, false>;
  dropout.grad_layout_only = 0b001;  // x (its layout decides dx's); out not read
  dropout.grad_reads = 0b100;        // the mask
  dropout.no_grad_outputs = 0b10;    // dmask
  dropout.grad_gradients_first = true;  // x, dout, mask
  r.dropout = derive_rule(std::move(dropout));
  FactorRule cumsum = rule_of("cumsum",
                    "the cumsum axis -> R; other dims pass; P(sum|avg) pass (linear), P(max|min) -> R. grad: "
                    "dx = reverse cumsum(dout), axis R, dout's P(sum|avg) passes",
                    cumsum_describe);
  cumsum.forward_partials = pass_partial<0, true>;
  cumsum.reverse_partials = pass_partial<0, true>;
  cumsum.grad_partials = pass_partial<2, true>;
  cumsum.grad_layout_only = 0b01;  // x; out not read
  cumsum.grad_reads = 0;
  r.cumsum = derive_rule(std::move(cumsum));
  r.arg_reduce = derive_rule(rule_of("arg_reduce",
                    "argmax/argmin: the reduced axis -> R (local indices are not global); other dims pass "
                    "(renumbered, keepdim '1'); every Partial -> R; no gradient (dx reported R)",
                    arg_describe));
  r.arg_reduce.grad = arg_grad;
  FactorRule topk = rule_of("topk",
                    "the topk axis -> R; other dims pass; values and indices sharded like x; every Partial -> "
                    "R. grad: x, indices, dvalues merged (axis R); dvalues' every Partial passes to dx",
                    topk_describe);
  topk.grad_partials = topk_grad_partials;
  topk.grad_reads = 0b101;       // x (its layout), indices; not values
  topk.no_grad_outputs = 0b10;   // dindices
  r.topk = derive_rule(std::move(topk));
  return r;
}

}  // namespace shardwise::ops
