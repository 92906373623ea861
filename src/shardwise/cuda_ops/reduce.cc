// sum and mean on CUDA (cuda/layout.h's reductions, float sums in double as the CPU's), the axes and
// keepdim read by ops::reduce_axes_mask / reduce_keepdim. Gradients: dout broadcast back to x's
// shape; mean's divided by the reduced count first (a correctly rounded division, as the CPU's).
#include "shardwise/core/error.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/reduction/kernels.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

// dout (of a reduction of x over `mask`) broadcast back to x's shape, divided by the reduced count
// when `mean`.
Tensor spread(const Tensor& x, const Tensor& dout, uint32_t mask, bool mean) {
  Shape kept = x.shape();
  int64_t n = 1;
  for (int d = 0; d < x.ndim(); ++d) {
    if (mask & (1u << d)) n *= kept[d], kept[d] = 1;
  }
  Tensor g = dout.reshaped(kept);
  if (mean) {
    const Tensor count = cuda::full(dout.dtype(), Shape{}, static_cast<double>(n), dout.device(), current_stream());
    g = cuda::binary(cuda::Binary::Div, g, count, current_stream());
  }
  return cuda::expand(g, x.shape(), current_stream());
}

void bind_reduce(ops::DeviceKernelTable& t, const char* name, bool mean) {
  t.add_forward(name, [mean](const OpDef& op, In in, const Attrs& attrs, const KernelContext*) {
    const uint32_t mask = ops::reduce_axes_mask(attrs, in[0].ndim(), op.name);
    const bool keep = ops::reduce_keepdim(attrs);
    return Tensors{mean ? cuda::reduce_mean(in[0], mask, keep, current_stream())
                        : cuda::reduce_sum(in[0], mask, keep, current_stream())};
  });
  t.add_backward(name, [mean](const OpDef& op, In in, In, In dout, const Attrs& attrs, const KernelContext*,
                              std::span<const bool>) {
    return Tensors{spread(in[0], dout[0], ops::reduce_axes_mask(attrs, in[0].ndim(), op.name), mean)};
  });
}

}  // namespace

void bind_reductions(ops::DeviceKernelTable& t) {
  bind_reduce(t, "sum", false);
  bind_reduce(t, "mean", true);
}

}  // namespace shardwise::cuda_ops
