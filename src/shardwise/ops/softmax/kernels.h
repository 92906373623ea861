#pragma once
// Reference CPU kernels of softmax, log_softmax and cross_entropy, forward and analytic backward.
//
// softmax / log_softmax(x; axis = -1): numerically stable (the slice's max is subtracted before
// exp); each slice along `axis` is computed in double and rounded once, except f32 slices along the
// last axis with a finite max and no NaN: exponentials in float (fast_expf, a few ulp; below e^-80
// of the max they are 0), sums in double, within ~1e-6 relative of the double path. An empty slice
// or an empty tensor gives an empty result. Floating dtypes only.
//   backward: softmax dx = out * (dout - sum(dout * out)); log_softmax dx = dout - exp(out) * sum(dout)
//   (sums along `axis`). Both read only the forward output and dout, never x.
//
// cross_entropy(logits [..., C], labels [...]; ignore_index = -100, reduction = "mean"):
//   per row i (a position of labels): loss_i = logsumexp(logits[i, :]) - logits[i, labels[i]],
//   or 0 when labels[i] == ignore_index. labels are i64 or i32; a label that is neither
//   ignore_index nor in [0, C) is an Error naming it. The class dim is the last dim of logits.
//   reduction "none": loss has labels' shape; "sum": a scalar, the sum over non-ignored rows;
//   "mean": a scalar, that sum divided by the number of non-ignored rows (PyTorch's semantics),
//   NaN (0 / 0) when every label is ignored or there are no rows, as in PyTorch.
//   backward: dlogits[i, c] = (softmax(logits[i])[c] - (c == labels[i])) * w_i with w_i = dloss[i]
//   (none), dloss (sum), dloss / count (mean); ignored rows get 0 (also when every label is ignored:
//   the gradient is all zeros, not NaN). labels get no gradient (undefined Tensor). Rows and sums
//   compute in double (f32 rows with a finite max and no NaN: exponentials in float as above);
//   loss has logits' dtype.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// The "axis" attribute (default -1) normalized into [0, ndim); Error naming `op` when out of
// range or when x is a scalar. Does not allocate (rules call it).
int softmax_axis(const Attrs& attrs, int ndim, std::string_view op);

Tensor softmax(const Tensor& x, int axis);
Tensor log_softmax(const Tensor& x, int axis);
Tensor softmax_backward(const Tensor& out, const Tensor& dout, int axis);
Tensor log_softmax_backward(const Tensor& out, const Tensor& dout, int axis);

enum class LossReduction : uint8_t { None, Sum, Mean };
// The "reduction" attribute ("none", "sum", "mean"; default "mean"); Error naming `op` otherwise.
// Does not allocate.
LossReduction loss_reduction(const Attrs& attrs, std::string_view op);
inline int64_t cross_entropy_ignore_index(const Attrs& attrs) { return attrs.get_int("ignore_index", -100); }
// Error naming the op unless logits are floating with rank >= 1, labels are i64 / i32 with shape
// logits.shape[:-1].
void check_cross_entropy_args(const Shape& logits, DType logits_dtype, const Shape& labels, DType labels_dtype);
// labels' shape for "none", a scalar otherwise.
Shape cross_entropy_loss_shape(const Shape& labels, LossReduction reduction);

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, LossReduction reduction);
// dlogits; dloss has cross_entropy_loss_shape and logits' dtype.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss, int64_t ignore_index,
                              LossReduction reduction);

// Vocab-parallel cross_entropy (Megatron-LM's scheme) in pieces around the collectives; the two
// functions above are these pieces on one block that holds every class. The local logits
// [..., C_local] hold classes [offset, offset + C_local) of `classes`; labels are global class ids
// (checked against `classes`); rows are the positions of labels.
struct ClassShard {
  int64_t classes = -1;  // the global class count; -1: logits' own C
  int64_t offset = 0;
};
// Per row, the max logit of this block (-inf when it holds no class): all-reduce (max) it.
std::vector<double> cross_entropy_local_max(const Tensor& logits);
// Per row, given the GLOBAL row max: the sum of exp(logit - max) over this block, and the label's
// logit where this block holds the label (0 elsewhere and on ignored rows): all-reduce (sum) both.
struct CrossEntropyRowSums {
  std::vector<double> sum_exp, target;
};
CrossEntropyRowSums cross_entropy_local_sums(const Tensor& logits, const Tensor& labels,
                                             std::span<const double> row_max, int64_t ignore_index,
                                             const ClassShard& shard = {});
// The loss (in `dtype`) from the global row max and sums: loss_i = max_i + log(sum_exp_i) -
// target_i, 0 on ignored rows, then the reduction.
Tensor cross_entropy_from_rows(const Tensor& labels, DType dtype, std::span<const double> row_max,
                               const CrossEntropyRowSums& sums, int64_t ignore_index, LossReduction reduction);
// This block's dlogits from the global row max and sum_exp: (softmax - onehot) * w as above.
Tensor cross_entropy_backward_from_rows(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                                        std::span<const double> row_max, std::span<const double> sum_exp,
                                        int64_t ignore_index, LossReduction reduction, const ClassShard& shard = {});

// The same two pieces on one buffer, for the fused LM head (lm_head.cc), with the same numbers:
// cross_entropy_local_sums_to_exp returns cross_entropy_local_sums' values and replaces each row that
// takes the f32 path by its exponentials exp_shifted(logit - max) (exp_rows[i] = 1); the other rows
// keep their logits. cross_entropy_grad_in_place then makes every row its dlogits (softmax - onehot)
// * w (w: the per-row weight of a "sum" / "mean" loss, dloss or dloss / count), 0 on ignored rows:
// cross_entropy_backward_from_rows' values without a second buffer or a second exponential.
CrossEntropyRowSums cross_entropy_local_sums_to_exp(Tensor& logits, const Tensor& labels,
                                                    std::span<const double> row_max, int64_t ignore_index,
                                                    const ClassShard& shard, std::vector<uint8_t>& exp_rows);
void cross_entropy_grad_in_place(Tensor& rows, const Tensor& labels, double w, std::span<const double> row_max,
                                 std::span<const double> sum_exp, std::span<const uint8_t> exp_rows,
                                 int64_t ignore_index, const ClassShard& shard);

}  // namespace shardwise::ops
