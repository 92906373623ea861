// lm_head_cross_entropy and vocab_parallel_lm_head_cross_entropy on CUDA (cuda/lm_head.h), the
// attributes read by ops::lm_head_args and W's vocab block from the context, as the CPU op reads
// them. The vocab-parallel op's group (the ranks holding the other vocab blocks of the same rows)
// all-reduces each chunk's row statistics (the max, then the sums of exponentials with the target
// logits: f64, in place) on device memory, under a comm::DeviceBuffers scope on the current
// stream, as the CPU op all-reduces its host vectors; without a group it runs as the plain head.
#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/loss/lm_head.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/softmax/lm_head.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

struct Head {
  ops::LmHeadArgs args;
  cuda::LmHeadOptions options;
};

// The op's arguments (W's vocab block from the context's entry of input 1, as the CPU op's
// head_args) and the CUDA options they give, with the all-reduce over W's vocab peers when it has
// any.
Head head_of(const OpDef& op, const Attrs& attrs, const KernelContext* ctx) {
  Head h;
  h.args = ops::lm_head_args(attrs, op.name);
  if (ctx != nullptr && ctx->tensors.size() >= 2 && ctx->tensors[1].global_shape.ndim() == 2) {
    h.args.shard = {ctx->tensors[1].global_shape[0], ctx->tensors[1].offset[0]};
    if (comm::Communicator* group = ctx->group_sharding(1, 1u, op.name)) h.options.combine = vocab_stats_all_reduce(group);
  }
  cuda::LmHeadOptions& o = h.options;
  o.ignore_index = h.args.ignore_index;
  o.reduction = cuda_reduction(h.args.reduction);
  o.classes = h.args.shard.classes;
  o.offset = h.args.shard.offset;
  o.chunk_bytes = h.args.chunk_bytes;
  o.grad_scale = h.args.grad_scale;
  return h;
}

// The forward's dh and dW among the outputs (undefined where forward_grads did not ask).
std::array<Tensor, 2> saved_grads(const ops::LmHeadArgs& a, In out) {
  std::array<Tensor, 2> saved;
  size_t next = 1;
  if ((a.forward_grads & ops::kLmHeadGradH) && next < out.size()) saved[0] = out[next++];
  if ((a.forward_grads & ops::kLmHeadGradW) && next < out.size()) saved[1] = out[next++];
  return saved;
}

// g times dloss / formed on the device (formed: `scale` in dloss's dtype), so dloss is never read
// back; dloss equal to it gives the factor 1 exactly and g unchanged, as the CPU's shortcut. A bf16
// g (bf16 h and W: dloss is f32, the loss's dtype) is scaled in f32 and rounded back, as the CPU's.
Tensor rescaled(const Tensor& g, const Tensor& dloss, double scale) {
  const Tensor formed = cuda::full(dloss.dtype(), Shape{}, scale, dloss.device(), current_stream());
  const Tensor factor = cuda::binary(cuda::Binary::Div, dloss, formed, current_stream());
  if (g.dtype() == factor.dtype()) return cuda::binary(cuda::Binary::Mul, g, factor, current_stream());
  const Tensor wide = cuda::cast(g, factor.dtype(), current_stream());
  return cuda::cast(cuda::binary(cuda::Binary::Mul, wide, factor, current_stream()), g.dtype(), current_stream());
}

Tensors head_forward(const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
  Head h = head_of(op, attrs, ctx);
  h.options.grads = h.args.forward_grads != 0;
  cuda::LmHeadResult r = cuda::lm_head_cross_entropy(in[0], in[1], in[2], h.options, current_stream());
  Tensors out{r.loss};
  if (h.args.forward_grads & ops::kLmHeadGradH) out.push_back(r.dh);
  if (h.args.forward_grads & ops::kLmHeadGradW) out.push_back(r.dw);
  return out;
}

// The saved gradients rescaled to dloss; the others recomputed by the fused kernel for dloss 1 and
// scaled by dloss (sum and mean: dloss is one number).
Tensors head_backward(const OpDef& op, In in, In out, In dout, const Attrs& attrs, const KernelContext* ctx,
                      std::span<const bool> wanted) {
  Head h = head_of(op, attrs, ctx);
  const std::array<Tensor, 2> saved = saved_grads(h.args, out);
  Tensors grads{Tensor(), Tensor(), Tensor()};
  bool recompute = false;
  for (size_t k = 0; k < 2; ++k) {
    if (wanted.size() > k && !wanted[k]) continue;
    if (saved[k].defined()) {
      grads[k] = rescaled(saved[k], dout[0], h.args.grad_scale);
    } else {
      recompute = true;
    }
  }
  if (!recompute) return grads;
  if (h.args.reduction == ops::LossReduction::None) unsupported(op, dout[0], "the gradient of reduction 'none'");
  h.options.grads = true;
  h.options.grad_scale = 1.0;
  cuda::LmHeadResult r = cuda::lm_head_cross_entropy(in[0], in[1], in[2], h.options, current_stream());
  const std::array<Tensor, 2> formed{r.dh, r.dw};
  for (size_t k = 0; k < 2; ++k) {
    if (!grads[k].defined() && (wanted.size() <= k || wanted[k])) grads[k] = rescaled(formed[k], dout[0], 1.0);
  }
  return grads;
}

}  // namespace

std::function<void(Tensor&, bool)> vocab_stats_all_reduce(comm::Communicator* group) {
  return [group](Tensor& stats, bool is_max) {
    SW_CHECK(stats.dtype() == DType::F64 && !stats.device().is_host(),
             "the vocab-parallel head's row statistics: f64 device memory expected, got {} on {}",
             dtype_name(stats.dtype()), stats.device().to_string());
    const comm::DeviceBuffers scope(stats.device(), current_stream());
    group->all_reduce(stats.device_ptr(), stats.device_ptr(), stats.numel(), DType::F64,
                      is_max ? comm::Reduce::Max : comm::Reduce::Sum);
  };
}

void bind_lm_head(ops::DeviceKernelTable& t) {
  for (const char* name : {"lm_head_cross_entropy", "vocab_parallel_lm_head_cross_entropy"}) {
    t.add_forward(name, head_forward);
    t.add_backward(name, head_backward);
  }
}

}  // namespace shardwise::cuda_ops
