// SPMD rules of the reductions (sum, mean, max, min, amax, amin, prod).
//
// Notation: x is labelled "abc..", the output by x's kept letters (keepdim: '1' in place of a
// reduced dim, never sharded). A mesh dim holds one placement per tensor, so each mesh dim is
// decided on its own:
//  - it shards a kept dim of x: kept, the output is sharded the same way;
//  - it shards a reduced dim of x: the local kernel reduces its block, and the output is
//    Partial on that mesh dim: sum -> P(sum), max/amax -> P(max), min/amin -> P(min) (empty
//    shards give the reduction's identity); mean -> P(avg) only when the mesh dims sharding that
//    axis split it into equal non-empty chunks (n divisible by the product of their sizes, kept
//    greedily in split order), else that mesh dim is resharded to Replicate; prod -> Replicate
//    (there is no Partial(prod));
//  - x is Partial on it: sum/mean keep P(sum) and P(avg) (linear), max/amax keep P(max),
//    min/amin keep P(min); any other Partial is resharded to Replicate.
#include <array>

#include "shardwise/core/error.h"
#include "shardwise/spmd/einsum.h"
#include "shardwise/ops/reduction/rules.h"
#include "shardwise/ops/reduction/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

// Letters of x, of the output and of the reduced dims, in inline buffers (no allocation).
struct Labels {
  std::array<char, kMaxDims> x_buf{}, out_buf{}, reduced_buf{};
  int nx = 0, nout = 0, nreduced = 0;
  uint32_t mask = 0;
  bool keepdim = false;

  Labels(int ndim, uint32_t reduced_mask, bool keep) : nx(ndim), mask(reduced_mask), keepdim(keep) {
    for (int d = 0; d < ndim; ++d) {
      char letter = static_cast<char>('a' + d);
      x_buf[static_cast<size_t>(d)] = letter;
      if (reduced(d)) {
        reduced_buf[static_cast<size_t>(nreduced++)] = letter;
        if (keepdim) out_buf[static_cast<size_t>(nout++)] = '1';
      } else {
        out_buf[static_cast<size_t>(nout++)] = letter;
      }
    }
  }
  bool reduced(int d) const { return (mask >> d) & 1u; }
  std::string_view x() const { return {x_buf.data(), static_cast<size_t>(nx)}; }
  std::string_view out() const { return {out_buf.data(), static_cast<size_t>(nout)}; }
  std::string_view reduced_letters() const { return {reduced_buf.data(), static_cast<size_t>(nreduced)}; }
};

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

// Mean: keeps, in split order, the mesh dims under which every chunk of a reduced axis stays
// equal and non-empty (n divisible by the product of the kept mesh dims' sizes).
void keep_even_reduced_shards(AxisMap& axes, const Labels& labels, const Shape& shape, const ProcessMesh& mesh) {
  for (int d = 0; d < shape.ndim(); ++d) {
    if (!labels.reduced(d)) continue;
    MeshDimList& dims = axes[static_cast<char>('a' + d)];
    MeshDimList kept;
    int64_t parts = 1;
    for (int m : dims) {
      int64_t next = parts * mesh.dim_size(m);
      if (shape[d] > 0 && shape[d] % next == 0) {
        kept.push_back(m);
        parts = next;
      }
    }
    dims = kept;
  }
}

void check_output_rank(std::string_view name, const TensorSpec& t, const Labels& labels, std::string_view what) {
  SW_CHECK(t.shape.ndim() == labels.nout, "{}: {} has rank {}, but reducing a rank-{} input gives rank {}", name,
           what, t.shape.ndim(), labels.nx, labels.nout);
}

SpmdResult reduce_forward(ReduceKind kind, std::string_view name, const ProcessMesh& mesh,
                          std::span<const TensorSpec> inputs, const Attrs& attrs) {
  check_inputs(name, mesh, inputs, 1);
  const TensorSpec& x = inputs[0];
  Labels labels(x.shape.ndim(), reduce_axes_mask(attrs, x.shape.ndim(), name), reduce_keepdim(attrs));
  ReduceOp axis_op{};
  bool axis_partial = reduced_axis_partial(kind, axis_op);
  AxisMap axes = merge_axes({labels.x()}, {x.dist}, axis_partial ? std::string_view() : labels.reduced_letters());
  if (kind == ReduceKind::Mean) keep_even_reduced_shards(axes, labels, x.shape, mesh);
  SpmdResult result;
  result.inputs.push_back(dist_from_axes(labels.x(), axes, mesh.ndim()));
  DistAttr out = dist_from_axes(labels.out(), axes, mesh.ndim());
  if (axis_partial) add_partial_for(out, labels.reduced_letters(), axes, axis_op);
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = x.dist[m];
    if (p.is_partial() && partial_passes(kind, p.reduce)) {
      result.inputs[0].set(m, p);
      out.set(m, p);
    }
  }
  result.outputs.push_back(out);
  return result;
}

// From the wanted output: kept dims map back to x; a wanted Partial on mesh dim m is made by
// sharding a reduced axis on m when that yields it (x's own reduced axis on m if x shards one,
// else the first reduced axis; mean also needs equal chunks), else by a Partial x that passes
// through, else m is Replicate. The forward rule then gives the consistent pair.
SpmdResult reduce_reverse(ReduceKind kind, std::string_view name, const ProcessMesh& mesh,
                          std::span<const TensorSpec> inputs, std::span<const TensorSpec> outputs,
                          const Attrs& attrs) {
  check_inputs(name, mesh, inputs, 1);
  check_inputs(name, mesh, outputs, 1);
  const TensorSpec& x = inputs[0];
  Labels labels(x.shape.ndim(), reduce_axes_mask(attrs, x.shape.ndim(), name), reduce_keepdim(attrs));
  check_output_rank(name, outputs[0], labels, "the output");
  const DistAttr& want = outputs[0].dist;
  DistAttr xd(mesh.ndim());
  int first_reduced = -1;
  for (int d = 0, j = 0; d < labels.nx; ++d) {
    if (labels.reduced(d)) {
      if (first_reduced < 0) first_reduced = d;
      if (labels.keepdim) ++j;
      continue;
    }
    MeshDimList dims = want.mesh_dims_of(j++);
    if (!dims.empty()) xd.set_shard_order(d, dims);
  }
  ReduceOp axis_op{};
  bool axis_partial = reduced_axis_partial(kind, axis_op);
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement& p = want[m];
    if (!p.is_partial()) continue;
    if (axis_partial && p.reduce == axis_op && first_reduced >= 0) {
      const Placement& given = x.dist[m];
      int d = given.is_shard() && labels.reduced(given.dim) ? given.dim : first_reduced;
      bool ok = true;
      if (kind == ReduceKind::Mean) {
        int64_t parts = mesh.dim_size(m);
        for (int o : xd.mesh_dims_of(d)) parts *= mesh.dim_size(o);
        ok = x.shape[d] > 0 && x.shape[d] % parts == 0;
      }
      if (ok) {
        xd.set(m, Placement::shard(d));
        continue;
      }
    }
    if (partial_passes(kind, p.reduce)) xd.set(m, p);
  }
  TensorSpec spec{x.shape, x.dtype, xd};
  return reduce_forward(kind, name, mesh, std::span<const TensorSpec>(&spec, 1), attrs);
}

// Grad inputs: x, out, dout; output: dx, sharded like x.
//  - sum: dx = broadcast(dout): x's reduced axes may stay sharded; x's values are not read.
//  - mean: dx = dout / N with N the LOCAL reduced count, so x's reduced axes must be Replicate.
//  - max/min: dx = dout * (x == out): exact on any block of x as long as out is the global
//    extremum, so x's reduced axes may stay sharded while out and dout are Replicate there.
//  - amax/amin: dx = dout * (x == out) / count, the tie count over the WHOLE reduced extent:
//    x's reduced axes must be Replicate.
//  - prod: dx = dout * product of the others: x's reduced axes must be Replicate.
// Kept dims: x, dout (and out where read) share one sharding (merged in that order, x first).
// On a mesh dim that shards nothing, dout's P(sum) / P(avg) passes to dx (x, out Replicate
// there) since dx is linear in dout; not for integer amax/amin (truncating division).
// x's values are not read by sum/mean and out is not read by sum/mean/prod: their Partials and
// (for out) whole distribution are left as given, no reshard.
SpmdResult reduce_grad(ReduceKind kind, std::string_view name, const ProcessMesh& mesh,
                       std::span<const TensorSpec> inputs, const Attrs& attrs) {
  check_inputs(name, mesh, inputs, 3);
  const TensorSpec& x = inputs[0];
  const TensorSpec& out = inputs[1];
  const TensorSpec& dout = inputs[2];
  Labels labels(x.shape.ndim(), reduce_axes_mask(attrs, x.shape.ndim(), name), reduce_keepdim(attrs));
  check_output_rank(name, out, labels, "out");
  check_output_rank(name, dout, labels, "dout");
  bool reduced_shardable = kind == ReduceKind::Sum || kind == ReduceKind::Max || kind == ReduceKind::Min;
  bool reads_x = kind != ReduceKind::Sum && kind != ReduceKind::Mean;
  bool reads_out = is_extremum(kind);
  bool linear = !((kind == ReduceKind::AMax || kind == ReduceKind::AMin) && !is_floating(dout.dtype));
  std::string_view replicated = reduced_shardable ? std::string_view() : labels.reduced_letters();
  AxisMap axes = reads_out ? merge_axes({labels.x(), labels.out(), labels.out()}, {x.dist, dout.dist, out.dist},
                                        replicated)
                           : merge_axes({labels.x(), labels.out()}, {x.dist, dout.dist}, replicated);
  int mesh_ndim = mesh.ndim();
  SpmdResult result;
  result.inputs.reserve(3);
  result.inputs.push_back(dist_from_axes(labels.x(), axes, mesh_ndim));
  result.inputs.push_back(reads_out ? dist_from_axes(labels.out(), axes, mesh_ndim) : out.dist);
  result.inputs.push_back(dist_from_axes(labels.out(), axes, mesh_ndim));
  DistAttr dx = dist_from_axes(labels.x(), axes, mesh_ndim);
  for (int m = 0; m < mesh_ndim; ++m) {
    if (axes.letter_of(m) != 0) continue;
    const Placement& g = dout.dist[m];
    if (linear && g.is_partial() && (g.reduce == ReduceOp::Sum || g.reduce == ReduceOp::Avg)) {
      result.inputs[2].set(m, g);
      dx.set(m, g);
    }
    if (!reads_x && x.dist[m].is_partial()) result.inputs[0].set(m, x.dist[m]);
  }
  result.outputs.push_back(dx);
  return result;
}

// `rule_name` must be a string literal: the rule parts keep a view of it for their messages.
Rule make_rule(ReduceKind kind, std::string_view rule_name, std::string summary) {
  return Rule{
      std::string(rule_name), std::move(summary),
      [kind, rule_name](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
        return reduce_forward(kind, rule_name, mesh, in, attrs);
      },
      [kind, rule_name](const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                        const Attrs& attrs) { return reduce_reverse(kind, rule_name, mesh, in, out, attrs); },
      [kind, rule_name](const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
        return reduce_grad(kind, rule_name, mesh, in, attrs);
      }};
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
