#pragma once
// Reference CPU kernels of softmax, log_softmax and cross_entropy, forward and analytic backward.
//
// softmax / log_softmax(x; axis = -1): numerically stable (the slice's max is subtracted before
// exp); each slice along `axis` is computed in double and rounded once. An empty slice or an
// empty tensor gives an empty result. Floating dtypes only.
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
//   compute in double; loss has logits' dtype.
#include <cstdint>
#include <string_view>

#include "shardwise/core/attrs.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise {

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

}  // namespace shardwise
