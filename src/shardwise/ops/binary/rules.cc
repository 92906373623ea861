// SPMD rules of the broadcasting elementwise ops: add/subtract, multiply, divide, maximum/fmax,
// minimum/fmin, the other binary ops (atan2, pow, bitwise_*) and where(cond, x, y).
//
// Sharding (all rules alike). The output dims are labelled 'a', 'b', ... ; each input is aligned to
// the right (NumPy broadcasting) and takes the label of the output dim it meets, except a size-1
// dim that broadcasts against a larger extent: it gets '1' and is never sharded (required R).
// spmd::merge_axes then decides, per letter, the mesh dims that shard it: the inputs are visited
// in argument order (x before y; cond before x before y), the first input sharding a letter wins,
// and a mesh dim shards at most one letter. Required inputs = dist_from_axes of each input's
// labels; output = dist_from_axes of the output labels. A sharding that loses is resharded.
//
// Partial. A mesh dim that shards a letter is Shard or Replicate for everyone, so a Partial input
// there is resharded. On every other mesh dim the rule looks at that mesh dim on its own (an input
// Shard there lost the merge and becomes R) and lets Partial through only where it is exact:
//  add, subtract:  P(sum) op P(sum) -> P(sum), P(avg) op P(avg) -> P(avg). P(sum) + R is NOT exact
//                  (the R operand would be counted once per rank): both become R.
//  multiply:       P(sum) x R -> P(sum), R x P(sum) -> P(sum), same for P(avg) (any broadcast: the
//                  product is linear in each factor). Both Partial: x keeps its Partial and y is
//                  reduced to R (P(s) x R is exact; two partial factors are not).
//  divide:         P(sum) / R -> P(sum), P(avg) / R -> P(avg); a Partial divisor becomes R.
//  maximum, fmax:  P(max) with P(max) or with R -> P(max) (max is monotone); if only one input is
//                  P(max), the other becomes R.  minimum, fmin: the same with P(min).
//  where:          cond is always R. x, y with the same Partial op -> that op (a per-element
//                  selection of a sum/avg/max/min is the sum/avg/max/min of the selections);
//                  P(max) or P(min) with R -> kept (x first); anything else R.
//  atan2, pow, bitwise_*: Partial is never exact -> R.
// Everything not listed: Replicate on that mesh dim.
//
// Reverse: the wanted output distribution is mapped to the inputs (broadcast '1' dims and dims an
// input lacks: R). A wanted Partial is kept where some input layout produces it exactly
// (add/subtract: both inputs P(sum|avg); multiply/divide: x P(sum|avg), y R; max/min ops: both
// P(max|min); where: x and y P(op), cond R); otherwise the returned output is R on that mesh dim.
//
// The three parts are derived from the labels (spmd/factor_rule.h); this file gives the labels and
// the Partial tables above.
//
// Grad: inputs are x, y, out, dout (cond, x, y, out, dout for where). All are merged in that order
// with the same labels (out and dout carry the output labels); each gradient takes its input's
// sharding, plus Partial(sum) on the mesh dims sharding a letter the input broadcasts along ('1'
// or absent): the local sum over that shard is only part of the total. dout's P(sum)/P(avg) on a
// mesh dim no letter shards passes to every gradient (each is linear in dout and its other
// factors are R there); dout's P(max)/P(min) and every other input's Partial become R. cond takes
// no gradient: its gradient's distribution is reported as R.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "shardwise/ops/binary/rules.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// How Partial placements pass through an op (see the file comment).
enum class PartialKind : uint8_t { None, Linear, Bilinear, Numerator, Max, Min, Select };

constexpr int kMaxOperands = 3;

// Which operands keep their Partial (else R) and the output's placement (R when none passes).
struct Kept {
  std::array<bool, kMaxOperands> keep{};
  Placement out;
};

// Forward: `p` holds each operand's given placement on a mesh dim that shards no letter, with
// Shard already replaced by R (it lost the merge). For where, p[0] is cond.
Kept choose_partial(PartialKind kind, std::span<const Placement> p) {
  Kept c;
  auto keep = [&](int k) {
    c.keep[static_cast<size_t>(k)] = true;
    c.out = p[static_cast<size_t>(k)];
  };
  switch (kind) {
    case PartialKind::None: break;
    case PartialKind::Linear:
      if (is_linear_partial(p[0]) && p[0] == p[1]) keep(0), keep(1);
      break;
    case PartialKind::Bilinear:
      if (is_linear_partial(p[0])) {
        keep(0);
      } else if (is_linear_partial(p[1])) {
        keep(1);
      }
      break;
    case PartialKind::Numerator:
      if (is_linear_partial(p[0])) keep(0);
      break;
    case PartialKind::Max:
    case PartialKind::Min: {
      ReduceOp op = kind == PartialKind::Max ? ReduceOp::Max : ReduceOp::Min;
      if (p[0].is_partial(op)) keep(0);
      if (p[1].is_partial(op)) keep(1);
      break;
    }
    case PartialKind::Select: {
      const Placement &x = p[1], &y = p[2];
      auto monotone = [](const Placement& q) { return q.is_partial(ReduceOp::Max) || q.is_partial(ReduceOp::Min); };
      if (x.is_partial() && x == y) {
        keep(1), keep(2);
      } else if (monotone(x)) {
        keep(1);
      } else if (monotone(y)) {
        keep(2);
      }
      break;
    }
  }
  return c;
}

// Reverse: which operands take the wanted output Partial `p`; none kept = not producible.
Kept reverse_partial(PartialKind kind, const Placement& p) {
  Kept c;
  auto keep = [&](int k) {
    c.keep[static_cast<size_t>(k)] = true;
    c.out = p;
  };
  switch (kind) {
    case PartialKind::None: break;
    case PartialKind::Linear:
      if (is_linear_partial(p)) keep(0), keep(1);
      break;
    case PartialKind::Bilinear:
    case PartialKind::Numerator:
      if (is_linear_partial(p)) keep(0);
      break;
    case PartialKind::Max:
      if (p.is_partial(ReduceOp::Max)) keep(0), keep(1);
      break;
    case PartialKind::Min:
      if (p.is_partial(ReduceOp::Min)) keep(0), keep(1);
      break;
    case PartialKind::Select: keep(1), keep(2); break;
  }
  return c;
}

// Every operand is right-aligned against the broadcast output "ab..": a dim meets the output letter
// of its position, or '1' where a size-1 dim broadcasts against a larger extent.
Factors describe(std::span<const TensorSpec> in) {
  const Shape out = in.size() == 2 ? broadcast_shapes(in[0].shape, in[1].shape)
                                   : broadcast_shapes(in[0].shape, in[1].shape, in[2].shape);
  Factors f;
  for (const TensorSpec& t : in) {
    Labels l;
    const int lead = out.ndim() - t.shape.ndim();
    for (int d = 0; d < t.shape.ndim(); ++d) {
      l.push(t.shape[d] == 1 && out[d + lead] != 1 ? '1' : static_cast<char>('a' + d + lead));
    }
    f.add_input(l);
  }
  f.add_output(labels_of_rank(out.ndim()), out);
  return f;
}

void set_kept(const Kept& k, std::span<const Placement> given, PartialChoice& choice) {
  for (size_t i = 0; i < given.size(); ++i) {
    if (k.keep[i]) choice.operands[i] = given[i];
  }
  choice.results[0] = k.out;
}

Rule make_rule(std::string name, std::string summary, PartialKind kind, int n) {
  FactorRule rule;
  rule.name = std::move(name);
  rule.summary = std::move(summary);
  rule.num_inputs = n;
  rule.describe = [](std::span<const TensorSpec> in, const Attrs&) { return describe(in); };
  rule.forward_partials = [kind](std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                                 PartialChoice& choice) { set_kept(choose_partial(kind, given), given, choice); };
  rule.reverse_partials = [kind](std::span<const Placement> want, std::span<const TensorSpec>, const Attrs&,
                                 PartialChoice& choice) {
    Kept k = reverse_partial(kind, want[0]);
    for (int i = 0; i < kMaxOperands; ++i) {
      if (k.keep[static_cast<size_t>(i)]) choice.operands[static_cast<size_t>(i)] = want[0];
    }
    choice.results[0] = k.out;
  };
  // dout's P(sum|avg) passes to every gradient (each is linear in dout); other Partials -> R.
  rule.grad_partials = [](std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                          PartialChoice& choice) {
    const Placement& dout = given.back();
    if (!is_linear_partial(dout)) return;
    choice.operands[given.size() - 1] = dout;
    choice.results.fill(dout);
  };
  if (kind == PartialKind::Select) rule.no_grad = 1;  // where's condition
  return derive_rule(std::move(rule));
}

constexpr std::string_view kShardText =
    "NumPy-broadcast inputs keep the merged sharding (first input wins; broadcast size-1 dims R); ";
constexpr std::string_view kGradText =
    "; grad: broadcast dims' grads P(sum) where out is sharded, dout P(sum|avg) passes through";

std::string summary(std::string_view partial) {
  return std::string(kShardText) + std::string(partial) + std::string(kGradText);
}

}  // namespace

BinaryRules binary_rules() {
  BinaryRules r;
  r.elementwise_add = make_rule("elementwise_add",
                         summary("add/subtract: P(sum) op P(sum) -> P(sum), P(avg) op P(avg) -> P(avg); any "
                                 "other Partial (incl. P + R) -> R"),
                         PartialKind::Linear, 2);
  r.elementwise_multiply = make_rule("elementwise_multiply",
                         summary("multiply: P(sum|avg) x R -> P(sum|avg) either side; both Partial: x keeps it, "
                                 "y -> R; P(max|min) -> R"),
                         PartialKind::Bilinear, 2);
  r.elementwise_divide = make_rule("elementwise_divide",
                         summary("divide: P(sum|avg) / R -> P(sum|avg); a Partial divisor and P(max|min) -> R"),
                         PartialKind::Numerator, 2);
  r.elementwise_max = make_rule("elementwise_max",
                         summary("maximum/fmax: P(max) with P(max) or R -> P(max); other Partials -> R"),
                         PartialKind::Max, 2);
  r.elementwise_min = make_rule("elementwise_min",
                         summary("minimum/fmin: P(min) with P(min) or R -> P(min); other Partials -> R"),
                         PartialKind::Min, 2);
  r.elementwise_binary = make_rule("elementwise_binary", summary("atan2/pow/bitwise: every Partial input -> R"),
                         PartialKind::None, 2);
  r.elementwise_where = make_rule("elementwise_where",
                         summary("where(cond, x, y): cond R on unsharded mesh dims; x, y same Partial -> kept; "
                                 "P(max|min) with R -> kept; else R"),
                         PartialKind::Select, 3);
  return r;
}

}  // namespace shardwise::ops
