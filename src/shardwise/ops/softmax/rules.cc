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
//
// lm_head_cross_entropy (h "ab..k", W "vk", labels "ab.."; k the hidden dim, v the vocabulary):
//  forward: merged in the order W, h, labels (W first: under sp the sequence-sharded h loses the tp
//    mesh dim to W's vocab sharding and is gathered, as the unfused head's matmul does, never the
//    weight); k is Replicate (contracted inside the kernel, which cannot reduce a Partial logit
//    through the softmax); v is Replicate (the plain op) or kept sharded (the vocab-parallel op:
//    the kernel all-reduces each chunk's row statistics). Loss as cross_entropy's (none: like
//    labels; sum: P(sum) on the mesh dims sharding a batch letter; mean: the batch letters R).
//  reverse: as cross_entropy's on h and labels; the vocab-parallel op keeps the given W's vocab
//    sharding on the mesh dims the wanted loss left free.
//  grad (h, W, labels, loss, dloss -> dh, dW, dlabels): the forward merge (with dloss after labels
//    for "none"); dh is laid out like h plus P(sum) on the mesh dims sharding v (each vocab block's
//    part of dlogits · W), dW like W plus P(sum) on those sharding a batch letter (each row block's
//    part of dlogitsᵀ · h); a P(sum|avg) dloss on a mesh dim that shards nothing passes to both.
//  forward_grads (the gradients formed in the forward as extra outputs): forward lays them out as
//    the gradients above; grad reads them so (h, W, labels, loss, [dh], [dW], dloss, [ddh], [ddW]),
//    the extra outputs' own grads (never read) laid out as the outputs, which autodiff puts in
//    their slots (OpDef::grad_outputs).
#include <array>

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"
#include "shardwise/ops/softmax/rules.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/ops/softmax/lm_head.h"

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

// The loss's distribution from the rows' (labels') and the merged axes: like labels for "none",
// else a scalar, P(sum) on the mesh dims sharding a batch letter (none for "mean": they are R).
DistAttr loss_dist(const DistAttr& labels, std::string_view batch, const AxisMap& axes, LossReduction reduction,
                   int nd) {
  if (reduction == LossReduction::None) return labels;
  DistAttr loss(nd);
  add_partial_for(loss, batch, axes, ReduceOp::Sum);
  return loss;
}

// Reverse of a "sum" loss: each mesh dim the wanted loss makes P(sum) shards a batch dim of the rows
// (`rows`: logits or h) and of labels: the one the given rows shard there, else dim 0.
void shard_rows_for_sum(const DistAttr& wanted, const DistAttr& given_rows, size_t batch_dims, DistAttr& rows,
                        DistAttr& labels) {
  for (int m = 0; m < wanted.mesh_ndim(); ++m) {
    if (!wanted[m].is_partial(ReduceOp::Sum)) continue;
    const Placement& given = given_rows[m];
    int d = given.is_shard() && given.dim < static_cast<int>(batch_dims) ? given.dim : 0;
    rows.set(m, Placement::shard(d));
    labels.set(m, Placement::shard(d));
  }
}

SpmdResult ce_forward(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                      const Attrs& attrs) {
  check_inputs(name, mesh, in, 2);
  CeLabels l = ce_labels(name, in[0], in[1], attrs);
  int nd = mesh.ndim();
  AxisMap axes = merge_axes({l.logits, l.batch}, {in[0].dist, in[1].dist}, l.replicated());
  SpmdResult r{{dist_from_axes(l.logits, axes, nd), dist_from_axes(l.batch, axes, nd)}, {}};
  r.outputs.push_back(loss_dist(r.inputs[1], l.batch, axes, l.reduction, nd));
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
    shard_rows_for_sum(out[0].dist, in[0].dist, l.batch.size(), specs[0].dist, specs[1].dist);
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

// ---- lm_head_cross_entropy and its vocab-parallel form: h "ab..k", W "vk", labels "ab..".

constexpr std::string_view kLmHead = "lm_head_cross_entropy";
constexpr std::string_view kVpLmHead = "vocab_parallel_lm_head_cross_entropy";

struct HeadLabels {
  std::string h, batch, w, replicated;
  LossReduction reduction;
  bool vocab_parallel;
  int forward_grads = 0;  // the extra outputs (lm_head.h)
  int outputs = 1;
};

HeadLabels head_labels(std::string_view name, const TensorSpec& h, const TensorSpec& w, const TensorSpec& labels,
                       const Attrs& attrs) {
  check_lm_head_args(h.shape, h.dtype, w.shape, w.dtype, labels.shape, labels.dtype);
  HeadLabels l;
  l.h = axis_letters(h.shape.ndim());
  l.batch = l.h.substr(0, l.h.size() - 1);
  l.w = std::string("v") + l.h.back();  // h's rank is at most kMaxDims < 'v'
  const LmHeadArgs args = lm_head_args(attrs, name);
  l.reduction = args.reduction;
  l.forward_grads = args.forward_grads;
  l.outputs = lm_head_num_outputs(args);
  l.vocab_parallel = name == kVpLmHead;
  l.replicated = l.h.substr(l.h.size() - 1);  // the hidden dim is contracted inside the kernel
  if (!l.vocab_parallel) l.replicated += 'v';
  if (l.reduction == LossReduction::Mean) l.replicated += l.batch;
  return l;
}

// The gradients' layouts: dh like h plus P(sum) on the mesh dims sharding v (each vocab block's
// part of dlogits · W), dW like W plus P(sum) on those sharding a batch letter (each row block's
// part of dlogitsᵀ · h).
std::array<DistAttr, 2> grad_dists(const HeadLabels& l, const AxisMap& axes, int nd) {
  std::array<DistAttr, 2> g{dist_from_axes(l.h, axes, nd), dist_from_axes(l.w, axes, nd)};
  add_partial_for(g[0], "v", axes, ReduceOp::Sum);
  add_partial_for(g[1], l.batch, axes, ReduceOp::Sum);
  return g;
}

// The forward's extra outputs (forward_grads): dh and / or dW laid out as the gradients.
std::vector<DistAttr> saved_grad_dists(const HeadLabels& l, const AxisMap& axes, int nd) {
  std::array<DistAttr, 2> g = grad_dists(l, axes, nd);
  std::vector<DistAttr> out;
  if (l.forward_grads & kLmHeadGradH) out.push_back(g[0]);
  if (l.forward_grads & kLmHeadGradW) out.push_back(g[1]);
  return out;
}

SpmdResult head_forward(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                        const Attrs& attrs) {
  check_inputs(name, mesh, in, 3);
  HeadLabels l = head_labels(name, in[0], in[1], in[2], attrs);
  const int nd = mesh.ndim();
  // W first: its vocab sharding wins a mesh dim h shards too (h is all-gathered, never the weight).
  AxisMap axes = merge_axes({l.w, l.h, l.batch}, {in[1].dist, in[0].dist, in[2].dist}, l.replicated);
  SpmdResult r{{dist_from_axes(l.h, axes, nd), dist_from_axes(l.w, axes, nd), dist_from_axes(l.batch, axes, nd)}, {}};
  r.outputs.push_back(loss_dist(r.inputs[2], l.batch, axes, l.reduction, nd));
  for (DistAttr& g : saved_grad_dists(l, axes, nd)) r.outputs.push_back(std::move(g));
  return r;
}

SpmdResult head_reverse(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> in,
                        std::span<const TensorSpec> out, const Attrs& attrs) {
  check_inputs(name, mesh, in, 3);
  HeadLabels l = head_labels(name, in[0], in[1], in[2], attrs);
  check_inputs(name, mesh, out, static_cast<size_t>(l.outputs));  // the loss decides; dh and dW follow
  const Shape loss = cross_entropy_loss_shape(in[2].shape, l.reduction);
  SW_CHECK(out[0].shape == loss, "{} reverse: loss has shape {}, expected {} for labels {}", name,
           out[0].shape.to_string(), loss.to_string(), in[2].shape.to_string());
  const int nd = mesh.ndim();
  std::array<TensorSpec, 3> specs{TensorSpec{in[0].shape, in[0].dtype, DistAttr(nd)},
                                  TensorSpec{in[1].shape, in[1].dtype, DistAttr(nd)},
                                  TensorSpec{in[2].shape, in[2].dtype, DistAttr(nd)}};
  if (l.reduction == LossReduction::None) {
    AxisMap axes = merge_axes({std::string_view(l.batch)}, {out[0].dist});
    specs[0].dist = dist_from_axes(l.h, axes, nd);
    specs[2].dist = dist_from_axes(l.batch, axes, nd);
  } else if (l.reduction == LossReduction::Sum && !l.batch.empty()) {
    shard_rows_for_sum(out[0].dist, in[0].dist, l.batch.size(), specs[0].dist, specs[2].dist);
  }
  if (l.vocab_parallel) {  // keep the given weight's vocab sharding where the wanted loss left the mesh dim free
    for (int m = 0; m < nd; ++m) {
      if (specs[0].dist[m].is_replicate() && in[1].dist[m].is_shard(0)) specs[1].dist.set(m, Placement::shard(0));
    }
  }
  return head_forward(name, mesh, specs, attrs);
}

// g: h, W, labels, the outputs (loss, [dh], [dW]), their grads (dloss, [ddh], [ddW]) -> dh, dW, dlabels.
SpmdResult head_grad(std::string_view name, const ProcessMesh& mesh, std::span<const TensorSpec> g,
                     const Attrs& attrs) {
  SW_CHECK(g.size() >= 3, "{} grad: expected h, W, labels, the outputs and their grads, got {} tensors", name, g.size());
  HeadLabels l = head_labels(name, g[0], g[1], g[2], attrs);
  const auto nout = static_cast<size_t>(l.outputs), dloss = 3 + nout;
  check_inputs(name, mesh, g, 3 + 2 * nout);
  const Shape loss = cross_entropy_loss_shape(g[2].shape, l.reduction);
  SW_CHECK(g[3].shape == loss && g[dloss].shape == loss, "{} grad: loss {} and dloss {} must have shape {}", name,
           g[3].shape.to_string(), g[dloss].shape.to_string(), loss.to_string());
  const int nd = mesh.ndim();
  const bool none = l.reduction == LossReduction::None;
  AxisMap axes = none ? merge_axes({l.w, l.h, l.batch, l.batch}, {g[1].dist, g[0].dist, g[2].dist, g[dloss].dist},
                                   l.replicated)
                      : merge_axes({l.w, l.h, l.batch}, {g[1].dist, g[0].dist, g[2].dist}, l.replicated);
  DistAttr h = dist_from_axes(l.h, axes, nd), w = dist_from_axes(l.w, axes, nd);
  DistAttr labels = dist_from_axes(l.batch, axes, nd);
  std::array<DistAttr, 2> grads = grad_dists(l, axes, nd);
  SpmdResult r{{h, w, labels, g[3].dist}, {grads[0], grads[1], labels}};
  for (DistAttr& d : saved_grad_dists(l, axes, nd)) r.inputs.push_back(std::move(d));  // as the forward made them
  r.inputs.push_back(none ? labels : DistAttr(nd));
  // The extra outputs' grads are never read (the loss's gradient is what flows): laid out as the
  // outputs, which autodiff puts in those slots (OpDef::grad_outputs); a zero fill (R) partializes
  // or slices for free.
  for (size_t k = 4; k < dloss; ++k) {
    DistAttr made = r.inputs[k];
    r.inputs.push_back(std::move(made));
  }
  pass_linear_partials(axes, nd, g[dloss].dist, r.inputs[dloss], std::span<DistAttr>(r.outputs.data(), 2));
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
  r.lm_head_cross_entropy = named_rule(
      kLmHead,
      "fused LM head + cross_entropy(h [..., H], W [V, H], labels [...]): H and V -> R (W's vocab gathered); "
      "batch dims of h and labels merged and kept; Partials -> R; loss as cross_entropy (none: like labels, sum: "
      "P(sum) on mesh dims sharding the batch, mean: batch R). Grad: dh like h, dW like W plus P(sum) on mesh dims "
      "sharding the batch; dloss P(sum|avg) on an otherwise unused mesh dim -> dh, dW same",
      head_forward, head_reverse, head_grad);
  r.vocab_parallel_lm_head_cross_entropy = named_rule(
      kVpLmHead,
      "lm_head_cross_entropy's rule with W's vocab dim KEPT sharded (W merged first: its vocab sharding wins a "
      "mesh dim h shards; the kernel all-reduces each chunk's row max, sum of exponentials and target logit); "
      "labels and loss R on those mesh dims. Grad: dh P(sum) on the mesh dims sharding the vocab, dW sharded like "
      "W plus P(sum) on those sharding the batch; reverse keeps the given W's vocab sharding",
      head_forward, head_reverse, head_grad);
  return r;
}

}  // namespace shardwise::ops
