// The shape ops on CUDA. The reshape family is a view (Tensor::reshaped: no data moves), so its own
// kernel runs on the device tensor as it is; transpose, expand and concat copy through
// cuda/layout.h, with the local extents the CPU kernels (ops/shape/kernels.h) give.
#include "shardwise/core/error.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/shape/kernels.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

void bind_view(ops::DeviceKernelTable& t, const char* name) {
  t.add_forward(name, [](const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
    return op.forward_in_context(in, attrs, context_or_single(ctx, in));
  });
  t.add_backward(name, [](const OpDef& op, In in, In out, In dout, const Attrs& attrs, const KernelContext* ctx,
                          std::span<const bool>) {
    SW_CHECK(ctx != nullptr || in[0].defined(), "op '{}' on {}: the backward needs the kernel context or x", op.name,
             dout[0].device().to_string());
    return op.backward_in_context(in, out, dout, attrs, context_or_single(ctx, in));
  });
}

std::vector<int> perm_dims(const ops::Perm& p) { return std::vector<int>(p.to.begin(), p.to.begin() + p.n); }

void bind_transpose(ops::DeviceKernelTable& t) {
  t.add_forward("transpose", [](const OpDef&, In in, const Attrs& attrs, const KernelContext*) {
    return Tensors{cuda::transpose(in[0], perm_dims(ops::transpose_perm(in[0].shape(), attrs)), current_stream())};
  });
  t.add_backward("transpose", [](const OpDef&, In, In, In dout, const Attrs& attrs, const KernelContext*,
                                 std::span<const bool>) {
    const ops::Perm back = ops::transpose_perm(dout[0].shape(), attrs).inverse();
    return Tensors{cuda::transpose(dout[0], perm_dims(back), current_stream())};
  });
}

// The global shapes of expand's input and output (the context's, else x's own).
struct ExpandShapes {
  Shape in, out;
};
ExpandShapes expand_shapes(const KernelContext* ctx, const Shape& local_in, const Attrs& attrs) {
  const Shape in = ctx != nullptr && !ctx->tensors.empty() ? ctx->tensors[0].global_shape : local_in;
  return {in, ops::expand_shape(in, attrs)};
}

void bind_expand(ops::DeviceKernelTable& t) {
  // Dims mapping 1:1 keep x's local extent; broadcast and new leading dims take the target's (as expand_local).
  t.add_forward("expand", [](const OpDef&, In in, const Attrs& attrs, const KernelContext* ctx) {
    const ExpandShapes g = expand_shapes(ctx, in[0].shape(), attrs);
    Shape local = g.out;
    const int lead = g.out.ndim() - g.in.ndim();
    for (int d = 0; d < g.in.ndim(); ++d) {
      if (!ops::expand_broadcasts(g.in, g.out, d)) local[d + lead] = in[0].shape()[d];
    }
    return Tensors{cuda::expand(in[0], local, current_stream())};
  });
  // dx: dout summed over the broadcast and leading dims into x's local block (as expand_backward_local).
  t.add_backward("expand", [](const OpDef& op, In in, In, In dout, const Attrs& attrs, const KernelContext* ctx,
                              std::span<const bool>) {
    SW_CHECK(ctx != nullptr || in[0].defined(), "op '{}' on {}: the backward needs the kernel context or x", op.name,
             dout[0].device().to_string());
    const ExpandShapes g = expand_shapes(ctx, in[0].defined() ? in[0].shape() : Shape{}, attrs);
    Shape local = g.in;
    const int lead = g.out.ndim() - g.in.ndim();
    for (int d = 0; d < g.in.ndim(); ++d) {
      if (!ops::expand_broadcasts(g.in, g.out, d)) local[d] = dout[0].shape()[d + lead];
    }
    return Tensors{cuda::sum_to_shape(dout[0], local, current_stream())};
  });
}

void bind_concat(ops::DeviceKernelTable& t) {
  t.add_forward("concat", [](const OpDef&, In in, const Attrs& attrs, const KernelContext*) {
    return Tensors{cuda::concat(in, ops::concat_axis(attrs, in[0].ndim(), "concat"), current_stream())};
  });
  // dout split back by the inputs' extents along the axis (the context's global ones, as the CPU kernel).
  t.add_backward("concat", [](const OpDef&, In in, In, In dout, const Attrs& attrs, const KernelContext* ctx,
                              std::span<const bool>) {
    const int axis = ops::concat_axis(attrs, dout[0].ndim(), "concat");
    const KernelContext c = context_or_single(ctx, in);
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < in.size(); ++k) sizes.push_back(c.tensors[k].global_shape[axis]);
    return cuda::split(dout[0], axis, sizes, current_stream());
  });
}

}  // namespace

void bind_layout(ops::DeviceKernelTable& t) {
  for (const char* name : {"reshape", "squeeze", "unsqueeze", "flatten"}) bind_view(t, name);
  bind_transpose(t);
  bind_expand(t);
  bind_concat(t);
}

}  // namespace shardwise::cuda_ops
