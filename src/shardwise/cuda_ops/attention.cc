// flash_attention and flash_attention_docs on CUDA (cuda/attention.h): the causal fused kernel with
// the op's scale and document ids, q [B, H, S, D] or grouped-query [B, G, R, S, D]. What that kernel
// lacks is an Error naming the op and the attribute, never a different answer: attention dropout
// (p > 0 while training), cp's balanced order (balanced_ranks > 1) and a sequence-sharded q (its
// first row not query 0, or keys not the whole sequence).
#include "shardwise/core/error.h"
#include "shardwise/cuda/layers/attention.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/attention/kernels.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

// The op's scale, after refusing what the CUDA kernel does not compute.
double checked_scale(const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
  const ops::AttentionArgs a = ops::attention_args(attrs);
  if (a.dropout()) unsupported(op, in[0], fmt::format("attention dropout (p = {} while training)", a.p));
  if (a.balanced_ranks > 1) {
    unsupported(op, in[0], fmt::format("balanced_ranks {} (cp's load-balanced order)", a.balanced_ranks));
  }
  const int seq_dim = in[0].ndim() - 2;
  if (ctx != nullptr && !ctx->tensors.empty() && ctx->tensors[0].offset[static_cast<size_t>(seq_dim)] != 0) {
    unsupported(op, in[0], "a sequence-sharded q (context-parallel blocks)");
  }
  if (in[1].ndim() >= 2 && in[1].shape()[in[1].ndim() - 2] != in[0].shape()[seq_dim]) {
    unsupported(op, in[0], "keys other than q's whole sequence (context-parallel blocks)");
  }
  return a.scale;
}

void bind(ops::DeviceKernelTable& t, const char* name, bool docs) {
  t.add_forward(name, [docs](const OpDef& op, In in, const Attrs& attrs, const KernelContext* ctx) {
    const double scale = checked_scale(op, in, attrs, ctx);
    cuda::AttentionResult r =
        cuda::flash_attention(in[0], in[1], in[2], docs ? in[3] : Tensor(), scale, current_stream());
    return Tensors{r.out, r.lse};
  });
  t.add_backward(name, [docs](const OpDef& op, In in, In out, In dout, const Attrs& attrs, const KernelContext* ctx,
                              std::span<const bool>) {
    const double scale = checked_scale(op, in, attrs, ctx);
    cuda::AttentionGradResult g = cuda::flash_attention_backward(in[0], in[1], in[2], docs ? in[3] : Tensor(), out[0],
                                                                 out[1], dout[0], scale, current_stream());
    Tensors r{g.dq, g.dk, g.dv};
    if (docs) r.emplace_back();
    return r;
  });
}

}  // namespace

void bind_attention(ops::DeviceKernelTable& t) {
  bind(t, "flash_attention", false);
  bind(t, "flash_attention_docs", true);
}

}  // namespace shardwise::cuda_ops
