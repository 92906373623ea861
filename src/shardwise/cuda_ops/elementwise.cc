// add, scale, swiglu, softmax and cast on CUDA (cuda/elementwise.h, cuda/kernels.h), each read as its CPU
// kernel reads its inputs and attributes.
#include "shardwise/core/dtype.h"
#include "shardwise/core/error.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

// dout itself where the shapes agree (as ops::binary_backward shares it), else its sums over the
// broadcast dims.
Tensor sum_back(const Tensor& dout, const Tensor& operand) {
  return dout.shape() == operand.shape() ? dout : cuda::sum_to_shape(dout, operand.shape(), current_stream());
}

void bind_binary(ops::DeviceKernelTable& t, const char* name, cuda::Binary b) {
  t.add_forward(name, [b](const OpDef&, In in, const Attrs&, const KernelContext*) {
    return Tensors{cuda::binary(b, in[0], in[1], current_stream())};
  });
  t.add_backward(name, [b](const OpDef& op, In in, In, In dout, const Attrs&, const KernelContext*, std::span<const bool>) {
    SW_CHECK(in[0].defined() && in[1].defined(), "op '{}' on {}: the backward needs the operands", op.name,
             dout[0].device().to_string());
    // add and subtract: +-dout summed back to each operand (dout itself where the shapes agree).
    if (b == cuda::Binary::Add || b == cuda::Binary::Sub) {
      Tensor dy = sum_back(dout[0], in[1]);
      if (b == cuda::Binary::Sub) dy = cuda::scale(dy, -1.0, 0.0, true, current_stream());
      return Tensors{sum_back(dout[0], in[0]), dy};
    }
    cuda::BinaryGrads g = cuda::binary_backward(b, in[0], in[1], dout[0], current_stream());
    return Tensors{g.dx, g.dy};
  });
}

void bind_scale(ops::DeviceKernelTable& t) {
  t.add_forward("scale", [](const OpDef&, In in, const Attrs& attrs, const KernelContext*) {
    return Tensors{cuda::scale(in[0], attrs.get_float("scale", 1.0), attrs.get_float("bias", 0.0),
                               attrs.get_bool("bias_after_scale", true), current_stream())};
  });
  t.add_backward("scale", [](const OpDef&, In, In, In dout, const Attrs& attrs, const KernelContext*, std::span<const bool>) {
    return Tensors{cuda::scale(dout[0], attrs.get_float("scale", 1.0), 0.0, true, current_stream())};
  });
}

void bind_swiglu(ops::DeviceKernelTable& t) {
  t.add_forward("swiglu", [](const OpDef&, In in, const Attrs&, const KernelContext*) {
    return Tensors{cuda::swiglu(in[0], in[1], current_stream())};
  });
  t.add_backward("swiglu", [](const OpDef&, In in, In, In dout, const Attrs&, const KernelContext*, std::span<const bool>) {
    cuda::SwigluGrads g = cuda::swiglu_backward(in[0], in[1], dout[0], current_stream());
    return Tensors{g.dgate, g.dup};
  });
}

// The CUDA softmax runs over the last dim only.
void need_last(const OpDef& op, const Attrs& attrs, const Tensor& x) {
  const int axis = ops::softmax_axis(attrs, x.ndim(), op.name);
  if (axis != x.ndim() - 1) unsupported(op, x, fmt::format("axis {} (the CUDA kernel: the last dim only)", axis));
}

void bind_softmax(ops::DeviceKernelTable& t) {
  t.add_forward("softmax", [](const OpDef& op, In in, const Attrs& attrs, const KernelContext*) {
    need_last(op, attrs, in[0]);
    return Tensors{cuda::softmax(in[0], current_stream())};
  });
  t.add_backward("softmax", [](const OpDef& op, In, In out, In dout, const Attrs& attrs, const KernelContext*,
                               std::span<const bool>) {
    need_last(op, attrs, out[0]);
    return Tensors{cuda::softmax_backward(out[0], dout[0], current_stream())};
  });
}

// cast between the floating dtypes (what `train --bf16` puts after every bf16 parameter, bf16 -> f32,
// and `--compute bf16` before and after its GEMMs and attention; the gradient the other way); the gradient is dout cast back to x's dtype, as the CPU's.
void bind_cast(ops::DeviceKernelTable& t) {
  t.add_forward("cast", [](const OpDef& op, In in, const Attrs& attrs, const KernelContext*) {
    SW_CHECK(attrs.has("dtype"), "op '{}' on {}: attribute dtype is required", op.name, in[0].device().to_string());
    return Tensors{cuda::cast(in[0], parse_dtype(attrs.get_string("dtype", "")), current_stream())};
  });
  t.add_backward("cast", [](const OpDef&, In in, In, In dout, const Attrs&, const KernelContext*, std::span<const bool>) {
    return Tensors{cuda::cast(dout[0], in[0].dtype(), current_stream())};
  });
}

}  // namespace

void bind_elementwise(ops::DeviceKernelTable& t) {
  bind_binary(t, "add", cuda::Binary::Add);
  bind_binary(t, "subtract", cuda::Binary::Sub);
  bind_binary(t, "multiply", cuda::Binary::Mul);
  bind_binary(t, "divide", cuda::Binary::Div);
  bind_scale(t);
  bind_swiglu(t);
  bind_softmax(t);
  bind_cast(t);
}

}  // namespace shardwise::cuda_ops
