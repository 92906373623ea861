#include "shardwise/cuda_ops/bind.h"

#include "shardwise/core/error.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/norm/kernels.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda_ops {

namespace {

// The CUDA kernels normalize over the last dim only.
void need_last_axis(const OpDef& op, const Attrs& attrs, const Tensor& x) {
  const int k = ops::norm_begin_axis(attrs, x.ndim(), op.name);
  if (k != x.ndim() - 1) {
    unsupported(op, x, fmt::format("begin_norm_axis {} of {} dims (it normalizes the last dim only)", k, x.ndim()));
  }
}

cuda::Reduction reduction_of(const Attrs& attrs) {
  return cuda_reduction(ops::loss_reduction(attrs, "cross_entropy"));
}

void bind_activation(ops::DeviceKernelTable& t, const char* name, cuda::Activation a) {
  t.add_forward(name, [a](const OpDef&, In in, const Attrs&, const KernelContext*) {
    return Tensors{cuda::activation(a, in[0], current_stream())};
  });
  t.add_backward(name, [a](const OpDef&, In in, In, In dout, const Attrs&, const KernelContext*, std::span<const bool>) {
    return Tensors{cuda::activation_backward(a, in[0], dout[0], current_stream())};
  });
}

void bind_norms(ops::DeviceKernelTable& t) {
  t.add_forward("layer_norm", [](const OpDef& op, In in, const Attrs& attrs, const KernelContext*) {
    need_last_axis(op, attrs, in[0]);
    cuda::LayerNormResult r = cuda::layer_norm(in[0], in[1], in[2], ops::norm_epsilon(attrs, ops::kLayerNormEpsilon), current_stream());
    return Tensors{r.out, r.mean, r.rstd};
  });
  t.add_backward("layer_norm", [](const OpDef& op, In in, In out, In dout, const Attrs& attrs, const KernelContext*,
                                  std::span<const bool>) {
    need_last_axis(op, attrs, in[0]);
    cuda::LayerNormGradResult g = cuda::layer_norm_backward(in[0], in[1], out[1], out[2], dout[0], current_stream());
    return Tensors{g.dx, g.dscale, g.dbias};
  });
  t.add_forward("rms_norm", [](const OpDef& op, In in, const Attrs& attrs, const KernelContext*) {
    need_last_axis(op, attrs, in[0]);
    cuda::RmsNormResult r = cuda::rms_norm(in[0], in[1], ops::norm_epsilon(attrs, ops::kRmsNormEpsilon), current_stream());
    return Tensors{r.out, r.inv_rms};
  });
  t.add_backward("rms_norm", [](const OpDef& op, In in, In out, In dout, const Attrs& attrs, const KernelContext*,
                                std::span<const bool>) {
    need_last_axis(op, attrs, in[0]);
    cuda::RmsNormGradResult g = cuda::rms_norm_backward(in[0], in[1], out[1], dout[0], current_stream());
    return Tensors{g.dx, g.dscale};
  });
}

void bind_cross_entropy(ops::DeviceKernelTable& t) {
  t.add_forward("cross_entropy", [](const OpDef&, In in, const Attrs& attrs, const KernelContext*) {
    return Tensors{cuda::cross_entropy(in[0], in[1], ops::cross_entropy_ignore_index(attrs), reduction_of(attrs), current_stream())};
  });
  t.add_backward("cross_entropy", [](const OpDef&, In in, In, In dout, const Attrs& attrs, const KernelContext*,
                                     std::span<const bool>) {
    return Tensors{cuda::cross_entropy_backward(in[0], in[1], dout[0], ops::cross_entropy_ignore_index(attrs),
                                                reduction_of(attrs), current_stream()),
                   Tensor()};
  });
}

// Zeros by a memset; any other value by the fill kernel (cuda::full).
Tensor cuda_fill(DType dtype, const Shape& shape, double value, Device device) {
  if (value == 0.0) return zeros_on(dtype, shape, device, current_stream());
  return cuda::full(dtype, shape, value, device, current_stream());
}

}  // namespace

cuda::launch::Reduction cuda_reduction(ops::LossReduction r) {
  switch (r) {
    case ops::LossReduction::None: return cuda::Reduction::None;
    case ops::LossReduction::Sum: return cuda::Reduction::Sum;
    case ops::LossReduction::Mean: return cuda::Reduction::Mean;
  }
  fail("cuda_reduction: unknown loss reduction {}", static_cast<int>(r));
}

KernelContext context_or_single(const KernelContext* ctx, In tensors) {
  return ctx != nullptr ? *ctx : KernelContext::single_device(tensors);
}

void unsupported(const OpDef& op, const Tensor& on, std::string_view what) {
  throw ops::UnsupportedOnDevice(
      fmt::format("op '{}' on {}: the CUDA kernel does not compute {}", op.name, on.device().to_string(), what),
      fmt::format("the CUDA kernel does not compute {}", what));
}

std::shared_ptr<const ops::DeviceKernelTable> cuda_kernel_table() {
  static const std::shared_ptr<const ops::DeviceKernelTable> table = [] {
    auto t = std::make_shared<ops::DeviceKernelTable>("cuda");
    bind_activation(*t, "gelu", cuda::Activation::Gelu);
    bind_activation(*t, "silu", cuda::Activation::Silu);
    bind_norms(*t);
    bind_cross_entropy(*t);
    bind_elementwise(*t);
    bind_reductions(*t);
    bind_layout(*t);
    bind_dense(*t);
    bind_attention(*t);
    bind_lm_head(*t);
    bind_moe(*t);
    bind_train(*t);
    t->set_fill(cuda_fill);
    return t;
  }();
  return table;
}

void install_cuda_kernels() { ops::install_device_kernels(DeviceKind::Cuda, cuda_kernel_table()); }

}  // namespace shardwise::cuda_ops
