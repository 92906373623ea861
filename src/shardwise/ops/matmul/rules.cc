// Rule "matmul": einsum-style sharding for matmul(x, y; trans_x, trans_y), derived from its factor
// description (spmd/factor_rule.h): the labels below plus the multilinear partial policy.
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
#include "shardwise/ops/matmul/kernels.h"
#include "shardwise/ops/matmul/rules.h"
#include "shardwise/spmd/factor_rule.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

char batch_letter(int i) { return static_cast<char>('a' + i); }

// The operand's labels: its batch dims right-aligned to the output's ('1' where it broadcasts),
// then its two matrix letters (one for a 1-D operand).
Labels operand_labels(const Shape& shape, const MatmulDims& d, int batch_ndim, bool vector, char row, char col) {
  Labels l;
  const int nb = d.batch.ndim();
  for (int j = 0; j < batch_ndim; ++j) {
    int i = j + nb - batch_ndim;
    l.push(shape[j] == 1 && d.batch[i] != 1 ? '1' : batch_letter(i));
  }
  if (vector) {
    l.push('k');
  } else {
    l.push(row);
    l.push(col);
  }
  return l;
}

Factors describe(std::span<const TensorSpec> in, const Attrs& attrs) {
  const Shape &xs = in[0].shape, &ys = in[1].shape;
  const MatmulDims d = matmul_dims(xs, ys, attrs.get_bool("trans_x", false), attrs.get_bool("trans_y", false));
  Factors f;
  f.add_input(operand_labels(xs, d, d.x_batch_ndim, d.x_vector, d.trans_x ? 'k' : 'm', d.trans_x ? 'm' : 'k'));
  f.add_input(operand_labels(ys, d, d.y_batch_ndim, d.y_vector, d.trans_y ? 'n' : 'k', d.trans_y ? 'k' : 'n'));
  Labels out;
  for (int i = 0; i < d.batch.ndim(); ++i) out.push(batch_letter(i));
  if (!d.x_vector) out.push('m');
  if (!d.y_vector) out.push('n');
  f.add_output(out, d.out);
  return f;
}

}  // namespace

MatmulRules matmul_rules() {
  MatmulRules r;
  FactorRule matmul;
  matmul.name = "matmul";
  matmul.summary =
      "einsum [batch..,m,k]x[batch..,k,n]->[batch..,m,n] (x wins, then y); S(k) on both -> out P(sum); "
      "sharding beats Partial on a mesh dim; else the first P(sum|avg) input (x, then y) passes to out, the other "
      "operand R; P(max|min) inputs -> R";
  matmul.num_inputs = 2;
  matmul.describe = describe;
  matmul.forward_partials = multilinear_forward;
  matmul.reverse_partials = multilinear_reverse;
  matmul.grad_partials = multilinear_grad;
  matmul.grad_reads = 0b011;  // x and y; not the output
  r.matmul = derive_rule(std::move(matmul));
  return r;
}

}  // namespace shardwise::ops
