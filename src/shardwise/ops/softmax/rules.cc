// SPMD rules of softmax / log_softmax ("softmax"), cross_entropy and vocab_parallel_cross_entropy.
//
// softmax (shared by softmax and log_softmax), x labelled "abc..":
//  forward: every dim but `axis` keeps x's sharding (co-shard order included); the softmax axis is
//    Replicate (each slice needs its whole max and sum); every Partial is resharded to Replicate
//    (softmax is not linear and does not commute with max / min). out is laid out like the
//    required x.
//  reverse: x = out = the wanted out with the axis and Partials made Replicate.
//  grad (x, out, dout -> dx): the kernels read out and dout only, merged in that order (axis
//    Replicate); dx is laid out like them. x is not read: it keeps its given distribution. On a
//    mesh dim that shards nothing, a P(sum) / P(avg) dout passes to dx (linear in dout for a fixed
//    out), out being Replicate there.
//  The three parts are derived by spmd/factor_rule.h from the description (x and out "abc..",
//  the axis a replicated factor) and the Partial tables below; cross_entropy and its
//  vocab-parallel form are hand-written (a reduction-dependent loss layout, a batch dim chosen
//  from the given logits, a class letter kept sharded while labels and loss are Replicate).
//
// cross_entropy (non-vocab-parallel), logits labelled "ab..c" (class letter last), labels "ab..":
//  forward: the class dim of logits is Replicate (a row's logsumexp needs every class; the
//    vocab-parallel variant needs a communicator). The batch letters merge from logits, then
//    labels (first sharding wins), and both are laid out on them; Partial logits and labels are
//    resharded to Replicate.
//    reduction "none": loss (labels' shape) is laid out like labels.
//    reduction "sum": loss is Partial(sum) on every mesh dim that shards a batch letter (each rank
//      sums its own rows; an empty shard or an all-ignored shard adds 0).
//    reduction "mean": the batch letters are Replicate too, so loss is Replicate. The divisor is
//      the GLOBAL number of non-ignored labels, which a rank holding a block of rows cannot know
//      (and per-shard counts differ even for even shards, so the local means are not a P(avg));
//      the exact choice is to reshard. Use reduction "sum" and divide by the all-reduced count to
//      keep a sharded batch.
//  reverse: "none": the batch letters from the wanted loss; "sum": each mesh dim wanted P(sum)
//    shards a batch dim of logits and labels (the batch dim the given logits shard on it, else dim
//    0); other wanted placements become Replicate; "mean": everything Replicate. Then forward.
//  grad (logits, labels, loss, dloss -> dlogits, dlabels): as forward, with dloss joining the
//    merge after labels for "none" (laid out like labels); for "sum" dloss (a scalar) is Replicate
//    on the mesh dims that shard a batch letter; for "mean" everything is Replicate. On a mesh dim
//    that shards nothing, a P(sum) / P(avg) dloss passes to dlogits (linear in dloss). loss is not
//    read: it keeps its given distribution. dlabels (always undefined) is given labels' layout.
//
// vocab_parallel_cross_entropy: the same rule with the class letter free to stay sharded (the
//  kernel all-reduces the row max, the sum of exponentials and the target logit along the mesh
//  dims sharding it). Labels and the loss carry no class letter, so they are Replicate on those
//  mesh dims: every rank of a row block ends with the whole loss of its rows. "mean" still makes
//  the batch letters Replicate (the global divisor), not the class letter. Reverse: as above, then
//  the given logits' class sharding is kept on the mesh dims the wanted loss left free. Grad:
//  dlogits keeps the class sharding (softmax - onehot is computed on each class block).
#include <array>

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/ops/softmax/rules.h"
#include "shardwise/ops/softmax/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// On every mesh dim that shards no letter, a P(sum) / P(avg) `grad` input passes to every output.
void pass_linear_partials(const AxisMap& axes, int mesh_ndim, const DistAttr& given, DistAttr& required,
                          std::span<DistAttr> outputs) {
  for (int m = 0; m < mesh_ndim; ++m) {
    if (axes.letter_of(m) != 0) continue;
    const Placement& p = given[m];
    if (!is_linear_partial(p)) continue;
    required.set(m, p);
    for (DistAttr& o : outputs) o.set(m, p);
  }
}

// x and out "abc..", the softmax axis a replicated factor.
Factors softmax_describe(std::span<const TensorSpec> in, const Attrs& attrs) {
  const Shape& shape = in[0].shape;
  Factors f;
  f.add_input(labels_of_rank(shape.ndim()));
  f.add_output(labels_of_rank(shape.ndim()), shape);
  f.replicated.push(f.inputs[0].chars[static_cast<size_t>(softmax_axis(attrs, shape.ndim(), "softmax"))]);
  return f;
}

void no_partials(std::span<const Placement>, std::span<const TensorSpec>, const Attrs&, PartialChoice&) {}

// dx is linear in dout for a fixed out: dout's P(sum) / P(avg) passes (out Replicate there).
void softmax_grad_partials(std::span<const Placement> given, std::span<const TensorSpec>, const Attrs&,
                           PartialChoice& choice) {
  if (!is_linear_partial(given[2])) return;
  choice.operands[2] = given[2];
  choice.results[0] = given[2];
}

Rule softmax_rule(std::string summary) {
  FactorRule rule;
  rule.name = "softmax";
  rule.summary = std::move(summary);
  rule.describe = softmax_describe;
  rule.forward_partials = no_partials;
  rule.reverse_partials = no_partials;
  rule.grad_partials = softmax_grad_partials;
  rule.grad_reads = 0b10u;  // out (and dout); not x
  return derive_rule(std::move(rule));
}

constexpr std::string_view kCrossEntropy = "cross_entropy";
constexpr std::string_view kVocabParallel = "vocab_parallel_cross_entropy";

struct CeLabels {
  std::string_view logits, batch, cls;
  LossReduction reduction;
  bool vocab_parallel;  // the kernel shares row statistics along the class-sharding mesh dims
  // The class letter when it must be Replicate (not vocab-parallel), else none.
  std::string_view class_replicated() const { return vocab_parallel ? std::string_view() : cls; }
  // Letters that are never sharded: those, and the batch letters too for "mean".
  std::string_view replicated() const {
    if (reduction != LossReduction::Mean) return class_replicated();
    return vocab_parallel ? batch : logits;
  }
};

// `name` is cross_entropy or vocab_parallel_cross_entropy.
CeLabels ce_labels(std::string_view name, const TensorSpec& logits, const TensorSpec& labels, const Attrs& attrs) {
  check_cross_entropy_args(logits.shape, logits.dtype, labels.shape, labels.dtype);
  std::string_view letters = axis_letters(logits.shape.ndim());
  auto nb = static_cast<size_t>(logits.shape.ndim() - 1);
  return {letters, letters.substr(0, nb), letters.substr(nb, 1), loss_reduction(attrs, name), name == kVocabParallel};
}

SpmdResult ce_forward(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                      const Attrs& attrs) {
  check_inputs(name, mesh, in, 2);
  CeLabels l = ce_labels(name, in[0], in[1], attrs);
  int nd = mesh.ndim();
  AxisMap axes = merge_axes({l.logits, l.batch}, {in[0].dist, in[1].dist}, l.replicated());
  SpmdResult r{{dist_from_axes(l.logits, axes, nd), dist_from_axes(l.batch, axes, nd)}, {}};
  if (l.reduction == LossReduction::None) {
    r.outputs.push_back(r.inputs[1]);
  } else {
    r.outputs.emplace_back(nd);
    add_partial_for(r.outputs[0], l.batch, axes, ReduceOp::Sum);  // no letters for "mean"
  }
  return r;
}

SpmdResult ce_reverse(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                      std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs(name, mesh, in, 2);
  check_inputs(name, mesh, out, 1);
  CeLabels l = ce_labels(name, in[0], in[1], attrs);
  SW_CHECK(out[0].shape == cross_entropy_loss_shape(in[1].shape, l.reduction),
           "{} reverse: loss has shape {}, expected {} for labels {}", name, out[0].shape.to_string(),
           cross_entropy_loss_shape(in[1].shape, l.reduction).to_string(), in[1].shape.to_string());
  int nd = mesh.ndim();
  std::array<TensorSpec, 2> specs{TensorSpec{in[0].shape, in[0].dtype, DistAttr(nd)},
                                  TensorSpec{in[1].shape, in[1].dtype, DistAttr(nd)}};
  if (l.reduction == LossReduction::None) {
    AxisMap axes = merge_axes({l.batch}, {out[0].dist});
    specs[0].dist = dist_from_axes(l.logits, axes, nd);
    specs[1].dist = dist_from_axes(l.batch, axes, nd);
  } else if (l.reduction == LossReduction::Sum && !l.batch.empty()) {
    for (int m = 0; m < nd; ++m) {
      if (!out[0].dist[m].is_partial(ReduceOp::Sum)) continue;
      const Placement& given = in[0].dist[m];
      int d = given.is_shard() && given.dim < static_cast<int>(l.batch.size()) ? given.dim : 0;
      specs[0].dist.set(m, Placement::shard(d));
      specs[1].dist.set(m, Placement::shard(d));
    }
  }
  if (l.vocab_parallel) {
    // The loss says nothing of the class dim: keep the given logits' class sharding where the
    // wanted loss left the mesh dim free (gathering the vocab is what this op avoids).
    const int cls = in[0].shape.ndim() - 1;
    for (int m = 0; m < nd; ++m) {
      if (specs[0].dist[m].is_replicate() && in[0].dist[m].is_shard(cls)) specs[0].dist.set(m, Placement::shard(cls));
    }
  }
  return ce_forward(name, mesh, specs, attrs);
}

SpmdResult ce_grad(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g, const Attrs& attrs) {
  check_inputs(name, mesh, g, 4);
  CeLabels l = ce_labels(name, g[0], g[1], attrs);
  Shape loss_shape = cross_entropy_loss_shape(g[1].shape, l.reduction);
  SW_CHECK(g[2].shape == loss_shape && g[3].shape == loss_shape,
           "{} grad: loss {} and dloss {} must have shape {}", name, g[2].shape.to_string(),
           g[3].shape.to_string(), loss_shape.to_string());
  int nd = mesh.ndim();
  bool none = l.reduction == LossReduction::None;
  AxisMap axes = none ? merge_axes({l.logits, l.batch, l.batch}, {g[0].dist, g[1].dist, g[3].dist},
                                   l.class_replicated())
                      : merge_axes({l.logits, l.batch}, {g[0].dist, g[1].dist}, l.replicated());
  DistAttr logits = dist_from_axes(l.logits, axes, nd);
  DistAttr labels = dist_from_axes(l.batch, axes, nd);
  SpmdResult r{{logits, labels, g[2].dist, none ? labels : DistAttr(nd)}, {logits, labels}};
  pass_linear_partials(axes, nd, g[3].dist, r.inputs[3], std::span<DistAttr>(r.outputs.data(), 1));
  return r;
}

}  // namespace

SoftmaxRules softmax_rules() {
  SoftmaxRules r;
  r.softmax = softmax_rule(
      "softmax / log_softmax: the softmax axis -> R, the other dims keep x's sharding, every Partial -> "
      "R; out like x. Grad: out and dout merged (axis R), dx like them, x not read (kept); dout "
      "P(sum|avg) on an otherwise unused mesh dim -> dx same");
  r.cross_entropy = named_rule(
      kCrossEntropy,
      "class dim of logits -> R; batch dims of logits and labels merged (logits first) and kept; Partial "
      "logits/labels -> R; loss: none -> like labels, sum -> P(sum) on mesh dims sharding the batch, mean -> batch R "
      "too and loss R (the divisor is the global non-ignored count). Grad: dlogits like logits (dloss like labels "
      "for none, R where the batch is sharded for sum); dloss P(sum|avg) on an otherwise unused mesh dim -> dlogits "
      "same",
      ce_forward, ce_reverse, ce_grad);
  r.vocab_parallel_cross_entropy = named_rule(
      kVocabParallel,
      "cross_entropy's rule with the class dim of logits KEPT sharded (the kernel all-reduces the row max, sum of "
      "exponentials and target logit along the class-sharding mesh dims); labels and loss are Replicate on those "
      "mesh dims (every rank of a row block gets the whole row loss); batch dims as cross_entropy (mean -> R). "
      "Grad: dlogits sharded like logits (class dim included), dloss like labels for none, R for sum/mean on the "
      "mesh dims sharding the batch or the classes; reverse keeps the given logits' class sharding",
      ce_forward, ce_reverse, ce_grad);
  return r;
}

}  // namespace shardwise::ops
