// Rule "matmul": einsum-style sharding for matmul(x, y; trans_x, trans_y).
//
// Labels: output batch dims 'a', 'b', ... (right-aligned); an input's batch dim of size 1 that
// broadcasts (output extent != 1) is '1' and never sharded; matrix dims m, k, n:
//   x [batch.., m, k] (trans_x: [.., k, m]; 1-D: [k]),  y [batch.., k, n] (trans_y: [.., n, k];
//   1-D: [k]),  out [batch.., m, n] (m dropped for a 1-D x, n dropped for a 1-D y).
//
// forward:
//  1. Shardings merge with merge_axes, x first then y (first tensor to shard a letter wins; a
//     mesh dim shards one letter). Required x, y = dist_from_axes; out takes Shard from its
//     batch / m / n letters and Partial(sum) on every mesh dim that shards k (each rank
//     multiplies its k-slices; an empty k slice contributes zeros).
//  2. Sharding beats Partial: a mesh dim that shards any letter after step 1 cannot also carry a
//     Partial input, so a Partial input there is resharded to Replicate.
//  3. On a mesh dim that shards nothing, the first of x, y that is Partial(sum) or Partial(avg)
//     keeps it and the output is Partial of the same op there (matmul is linear in each operand);
//     the other operand must be Replicate there (both Partial: y is reduced first).
//     Partial(max) / Partial(min) inputs are not linear: always resharded to Replicate.
// reverse: the wanted output gives the letters: batch / m / n shards as wanted; Partial(sum)
//  mesh dims become k shards (x and y both S(k) there, in mesh-dim order); Partial(avg) mesh dims
//  become x Partial(avg) with y Replicate; Partial(max|min) cannot be produced: Replicate.
// grad (inputs x, y, out, dout -> dx, dy): x, y and dout merge with the letters above (x, y,
//  dout order). dx = dout * y^T contracts n and the batch letters x broadcasts over; dy = x^T *
//  dout contracts m and the batch letters y broadcasts over: each grad is Partial(sum) on the
//  mesh dims sharding its contracted letters. On a mesh dim that shards nothing the first of x,
//  y, dout holding Partial(sum|avg) keeps it (the others Replicate there): x Partial -> dy
//  Partial (dx Replicate), y Partial -> dx Partial (dy Replicate), dout Partial -> both Partial.
//  `out` is not read by the gradient kernel: it keeps its given distribution (no reshard).
#include <array>

#include "shardwise/spmd/einsum.h"
#include "shardwise/ops/matmul/rules.h"
#include "shardwise/ops/matmul/kernels.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

struct Notation {
  std::array<char, kMaxDims> chars{};
  int size = 0;
  void push(char c) { chars[static_cast<size_t>(size++)] = c; }
  std::string_view view() const { return {chars.data(), static_cast<size_t>(size)}; }
};

struct Labels {
  Notation x, y, out;
  MatmulDims dims;
};

char batch_letter(int i) { return static_cast<char>('a' + i); }

Labels label(const TensorSpec& x, const TensorSpec& y, const Attrs& attrs) {
  Labels l;
  l.dims = matmul_dims(x.shape, y.shape, attrs.get_bool("trans_x", false), attrs.get_bool("trans_y", false));
  const MatmulDims& d = l.dims;
  int nb = d.batch.ndim();
  for (int j = 0; j < d.x_batch_ndim; ++j) {
    int i = j + nb - d.x_batch_ndim;
    l.x.push(x.shape[j] == 1 && d.batch[i] != 1 ? '1' : batch_letter(i));
  }
  if (d.x_vector) {
    l.x.push('k');
  } else {
    l.x.push(d.trans_x ? 'k' : 'm');
    l.x.push(d.trans_x ? 'm' : 'k');
  }
  for (int j = 0; j < d.y_batch_ndim; ++j) {
    int i = j + nb - d.y_batch_ndim;
    l.y.push(y.shape[j] == 1 && d.batch[i] != 1 ? '1' : batch_letter(i));
  }
  if (d.y_vector) {
    l.y.push('k');
  } else {
    l.y.push(d.trans_y ? 'n' : 'k');
    l.y.push(d.trans_y ? 'k' : 'n');
  }
  for (int i = 0; i < nb; ++i) l.out.push(batch_letter(i));
  if (!d.x_vector) l.out.push('m');
  if (!d.y_vector) l.out.push('n');
  return l;
}

// The batch letters of the output that `input` (an operand's notation) does not carry: the
// operand's gradient sums over them.
Notation missing_batch_letters(const Labels& l, const Notation& input) {
  Notation missing;
  for (int i = 0; i < l.dims.batch.ndim(); ++i) {
    if (input.view().find(batch_letter(i)) == std::string_view::npos) missing.push(batch_letter(i));
  }
  return missing;
}

bool is_linear_partial(const Placement& p) {
  return p.is_partial(ReduceOp::Sum) || p.is_partial(ReduceOp::Avg);
}

SpmdResult matmul_forward_rule(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("matmul", mesh, in, 2);
  Labels l = label(in[0], in[1], attrs);
  int nd = mesh.ndim();
  AxisMap axes = merge_axes({l.x.view(), l.y.view()}, {in[0].dist, in[1].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(l.x.view(), axes, nd), dist_from_axes(l.y.view(), axes, nd)};
  r.outputs = {dist_from_axes(l.out.view(), axes, nd)};
  add_partial_for(r.outputs[0], "k", axes, ReduceOp::Sum);
  for (int m = 0; m < nd; ++m) {
    if (axes.letter_of(m) != 0) continue;
    for (size_t t = 0; t < 2; ++t) {
      const Placement& p = in[t].dist[m];
      if (!is_linear_partial(p)) continue;
      r.inputs[t].set(m, p);
      r.outputs[0].set(m, p);
      break;
    }
  }
  return r;
}

SpmdResult matmul_reverse_rule(const ProcessMesh& mesh, std::span<const TensorSpec> in, std::span<const TensorSpec> out,
                          const Attrs& attrs) {
  check_inputs("matmul", mesh, in, 2);
  check_inputs("matmul (outputs)", mesh, out, 1);
  Labels l = label(in[0], in[1], attrs);
  SW_CHECK(out[0].shape == l.dims.out, "matmul reverse: output shape {} does not match x {} and y {} (expected {})",
           out[0].shape.to_string(), in[0].shape.to_string(), in[1].shape.to_string(), l.dims.out.to_string());
  int nd = mesh.ndim();
  const DistAttr& want = out[0].dist;
  AxisMap axes = merge_axes({l.out.view()}, {want});
  for (int m = 0; m < nd; ++m) {
    if (want[m].is_partial(ReduceOp::Sum)) axes['k'].push_back(m);
  }
  SpmdResult r;
  r.inputs = {dist_from_axes(l.x.view(), axes, nd), dist_from_axes(l.y.view(), axes, nd)};
  r.outputs = {dist_from_axes(l.out.view(), axes, nd)};
  add_partial_for(r.outputs[0], "k", axes, ReduceOp::Sum);
  for (int m = 0; m < nd; ++m) {
    if (!want[m].is_partial(ReduceOp::Avg)) continue;
    r.inputs[0].set(m, want[m]);
    r.outputs[0].set(m, want[m]);
  }
  return r;
}

SpmdResult matmul_grad_rule(const ProcessMesh& mesh, std::span<const TensorSpec> in, const Attrs& attrs) {
  check_inputs("matmul grad", mesh, in, 4);
  Labels l = label(in[0], in[1], attrs);
  SW_CHECK(in[3].shape == l.dims.out && in[2].shape == l.dims.out,
           "matmul grad: out {} and dout {} must have the output shape {} of x {} and y {}", in[2].shape.to_string(),
           in[3].shape.to_string(), l.dims.out.to_string(), in[0].shape.to_string(), in[1].shape.to_string());
  int nd = mesh.ndim();
  AxisMap axes = merge_axes({l.x.view(), l.y.view(), l.out.view()}, {in[0].dist, in[1].dist, in[3].dist});
  SpmdResult r;
  r.inputs = {dist_from_axes(l.x.view(), axes, nd), dist_from_axes(l.y.view(), axes, nd), in[2].dist,
              dist_from_axes(l.out.view(), axes, nd)};
  r.outputs = {r.inputs[0], r.inputs[1]};  // each grad is laid out like its input, before partials
  Notation dx_sum = missing_batch_letters(l, l.x);
  if (!l.dims.y_vector) dx_sum.push('n');
  Notation dy_sum = missing_batch_letters(l, l.y);
  if (!l.dims.x_vector) dy_sum.push('m');
  add_partial_for(r.outputs[0], dx_sum.view(), axes, ReduceOp::Sum);
  add_partial_for(r.outputs[1], dy_sum.view(), axes, ReduceOp::Sum);
  static constexpr size_t kOperand[3] = {0, 1, 3};  // x, y, dout among the grad inputs
  for (int m = 0; m < nd; ++m) {
    if (axes.letter_of(m) != 0) continue;
    for (size_t t = 0; t < 3; ++t) {
      const Placement& p = in[kOperand[t]].dist[m];
      if (!is_linear_partial(p)) continue;
      r.inputs[kOperand[t]].set(m, p);
      // dx is linear in y and dout, dy in x and dout.
      if (t != 0) r.outputs[0].set(m, p);
      if (t != 1) r.outputs[1].set(m, p);
      break;
    }
  }
  return r;
}

}  // namespace

MatmulRules matmul_rules() {
  MatmulRules r;
  r.matmul = Rule{
      "matmul",
      "einsum [batch..,m,k]x[batch..,k,n]->[batch..,m,n] (x wins, then y); S(k) on both -> out P(sum); "
      "sharding beats Partial on a mesh dim; else the first P(sum|avg) input (x, then y) passes to out, the other "
      "operand R; P(max|min) inputs -> R",
      matmul_forward_rule, matmul_reverse_rule, matmul_grad_rule};
  return r;
}

}  // namespace shardwise::ops
