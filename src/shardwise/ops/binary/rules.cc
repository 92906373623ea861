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

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
#include "shardwise/ops/binary/rules.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// How Partial placements pass through an op (see the file comment).
enum class PartialKind : uint8_t { None, Linear, Bilinear, Numerator, Max, Min, Select };

constexpr int kMaxOperands = 3;

// The labels of one tensor, stored inline (rules must not allocate).
struct Labels {
  std::array<char, kMaxDims> chars{};
  int n = 0;
  std::string_view view() const { return {chars.data(), static_cast<size_t>(n)}; }
  bool has(char c) const { return view().find(c) != std::string_view::npos; }
};

Labels output_labels(int ndim) {
  Labels l;
  for (int d = 0; d < ndim; ++d) l.chars[static_cast<size_t>(l.n++)] = static_cast<char>('a' + d);
  return l;
}

// Right-aligned labels of an input of shape `in` against the broadcast output shape `out`.
Labels input_labels(const Shape& in, const Shape& out) {
  Labels l;
  const int lead = out.ndim() - in.ndim();
  for (int d = 0; d < in.ndim(); ++d) {
    bool broadcast = in[d] == 1 && out[d + lead] != 1;
    l.chars[static_cast<size_t>(l.n++)] = broadcast ? '1' : static_cast<char>('a' + d + lead);
  }
  return l;
}

// Output letters that `in` does not carry (it broadcasts along them, or lacks the dim).
Labels missing_letters(const Labels& in, const Labels& out) {
  Labels l;
  for (char c : out.view()) {
    if (!in.has(c)) l.chars[static_cast<size_t>(l.n++)] = c;
  }
  return l;
}

// Bit m set when mesh dim m shards some letter.
uint32_t claimed_mesh_dims(const AxisMap& axes, const Labels& out) {
  uint32_t mask = 0;
  for (char c : out.view()) {
    for (int m : axes[c]) mask |= 1u << m;
  }
  return mask;
}

Shape broadcast_operands(std::span<const TensorSpec> in, int n) {
  return n == 2 ? broadcast_shapes(in[0].shape, in[1].shape)
                : broadcast_shapes(in[0].shape, in[1].shape, in[2].shape);
}

bool is_linear_partial(const Placement& p) {
  return p.is_partial(ReduceOp::Sum) || p.is_partial(ReduceOp::Avg);
}

struct PartialChoice {
  std::array<bool, kMaxOperands> keep{};  // keep the operand's Partial (else R)
  Placement out;                          // R when no Partial passes
};

// Forward: `p` holds each operand's given placement on a mesh dim that shards no letter, with
// Shard already replaced by R (it lost the merge). For where, p[0] is cond.
PartialChoice choose_partial(PartialKind kind, std::span<const Placement> p) {
  PartialChoice c;
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
PartialChoice reverse_partial(PartialKind kind, const Placement& p) {
  PartialChoice c;
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

struct Prepared {
  Shape out;
  Labels out_labels;
  std::array<Labels, kMaxOperands> labels;
  std::array<std::string_view, kMaxOperands + 2> notations;
};

Prepared prepare(std::span<const TensorSpec> in, int n) {
  Prepared p;
  p.out = broadcast_operands(in, n);
  p.out_labels = output_labels(p.out.ndim());
  for (int k = 0; k < n; ++k) {
    p.labels[static_cast<size_t>(k)] = input_labels(in[static_cast<size_t>(k)].shape, p.out);
    p.notations[static_cast<size_t>(k)] = p.labels[static_cast<size_t>(k)].view();
  }
  return p;
}

SpmdResult binary_forward(std::string_view name, PartialKind kind, int n, const ProcessMesh& mesh,
                          std::span<const TensorSpec> in) {
  check_inputs(name, mesh, in, static_cast<size_t>(n));
  const Prepared p = prepare(in, n);
  std::array<DistAttr, kMaxOperands> dists;
  for (int k = 0; k < n; ++k) dists[static_cast<size_t>(k)] = in[static_cast<size_t>(k)].dist;
  const auto un = static_cast<size_t>(n);
  AxisMap axes = merge_axes(std::span<const std::string_view>(p.notations.data(), un),
                            std::span<const DistAttr>(dists.data(), un));
  const int md = mesh.ndim();
  SpmdResult r;
  r.inputs.reserve(un);
  for (size_t k = 0; k < un; ++k) r.inputs.push_back(dist_from_axes(p.notations[k], axes, md));
  DistAttr out = dist_from_axes(p.out_labels.view(), axes, md);
  const uint32_t claimed = claimed_mesh_dims(axes, p.out_labels);
  for (int m = 0; m < md; ++m) {
    if (claimed & (1u << m)) continue;
    std::array<Placement, kMaxOperands> given{};
    bool any = false;
    for (size_t k = 0; k < un; ++k) {
      const Placement& q = in[k].dist[m];
      if (q.is_partial()) given[k] = q, any = true;
    }
    if (!any) continue;
    PartialChoice c = choose_partial(kind, std::span<const Placement>(given.data(), un));
    for (size_t k = 0; k < un; ++k) {
      if (c.keep[k]) r.inputs[k].set(m, given[k]);
    }
    if (c.out.is_partial()) out.set(m, c.out);
  }
  r.outputs.push_back(out);
  return r;
}

SpmdResult binary_reverse(std::string_view name, PartialKind kind, int n, const ProcessMesh& mesh,
                          std::span<const TensorSpec> in, std::span<const TensorSpec> outs) {
  check_inputs(name, mesh, in, static_cast<size_t>(n));
  SW_CHECK(outs.size() == 1, "rule '{}' has 1 output, got {}", name, outs.size());
  const Prepared p = prepare(in, n);
  SW_CHECK(outs[0].shape == p.out, "rule '{}': the output has shape {} but the inputs broadcast to {}", name,
           outs[0].shape.to_string(), p.out.to_string());
  outs[0].dist.validate(p.out.ndim(), mesh.ndim(), "output");
  const int md = mesh.ndim();
  std::string_view out_nota = p.out_labels.view();
  AxisMap axes = merge_axes({out_nota}, {outs[0].dist});
  SpmdResult r;
  r.inputs.reserve(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) r.inputs.push_back(dist_from_axes(p.notations[static_cast<size_t>(k)], axes, md));
  DistAttr out = dist_from_axes(out_nota, axes, md);
  for (int m = 0; m < md; ++m) {
    const Placement& want = outs[0].dist[m];
    if (!want.is_partial()) continue;
    PartialChoice c = reverse_partial(kind, want);
    for (int k = 0; k < n; ++k) {
      if (c.keep[static_cast<size_t>(k)]) r.inputs[static_cast<size_t>(k)].set(m, want);
    }
    if (c.out.is_partial()) out.set(m, want);
  }
  r.outputs.push_back(out);
  return r;
}

SpmdResult binary_grad(std::string_view name, PartialKind kind, int n, const ProcessMesh& mesh,
                       std::span<const TensorSpec> g) {
  check_inputs(name, mesh, g, static_cast<size_t>(n + 2));
  Prepared p = prepare(g, n);
  const auto un = static_cast<size_t>(n);
  for (size_t k = un; k < un + 2; ++k) {
    SW_CHECK(g[k].shape == p.out, "rule '{}' grad: {} has shape {} but the inputs broadcast to {}", name,
             k == un ? "out" : "dout", g[k].shape.to_string(), p.out.to_string());
    p.notations[k] = p.out_labels.view();
  }
  std::array<DistAttr, kMaxOperands + 2> dists;
  for (size_t k = 0; k < un + 2; ++k) dists[k] = g[k].dist;
  AxisMap axes = merge_axes(std::span<const std::string_view>(p.notations.data(), un + 2),
                            std::span<const DistAttr>(dists.data(), un + 2));
  const int md = mesh.ndim();
  SpmdResult r;
  r.inputs.reserve(un + 2);
  for (size_t k = 0; k < un + 2; ++k) r.inputs.push_back(dist_from_axes(p.notations[k], axes, md));
  // cond (where) takes no gradient: R.
  const size_t first_grad = kind == PartialKind::Select ? 1 : 0;
  r.outputs.reserve(un);
  for (size_t k = 0; k < un; ++k) {
    if (k < first_grad) {
      r.outputs.emplace_back(md);
      continue;
    }
    DistAttr gd = dist_from_axes(p.notations[k], axes, md);
    Labels missing = missing_letters(p.labels[k], p.out_labels);
    add_partial_for(gd, missing.view(), axes, ReduceOp::Sum);
    r.outputs.push_back(gd);
  }
  const uint32_t claimed = claimed_mesh_dims(axes, p.out_labels);
  const DistAttr& dout = g[un + 1].dist;
  for (int m = 0; m < md; ++m) {
    if ((claimed & (1u << m)) || !is_linear_partial(dout[m])) continue;
    r.inputs[un + 1].set(m, dout[m]);
    for (size_t k = first_grad; k < un; ++k) r.outputs[k].set(m, dout[m]);
  }
  return r;
}

Rule make_rule(std::string name, std::string summary, PartialKind kind, int n) {
  Rule rule;
  rule.name = std::move(name);
  rule.summary = std::move(summary);
  // The lambdas own a copy of the name: check_inputs reads it only on failure.
  rule.forward = [name = rule.name, kind, n](const ProcessMesh& mesh, std::span<const TensorSpec> in,
                                             const Attrs&) { return binary_forward(name, kind, n, mesh, in); };
  rule.reverse = [name = rule.name, kind, n](const ProcessMesh& mesh, std::span<const TensorSpec> in,
                                             std::span<const TensorSpec> outs, const Attrs&) {
    return binary_reverse(name, kind, n, mesh, in, outs);
  };
  rule.grad = [name = rule.name, kind, n](const ProcessMesh& mesh, std::span<const TensorSpec> g,
                                          const Attrs&) { return binary_grad(name, kind, n, mesh, g); };
  return rule;
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
