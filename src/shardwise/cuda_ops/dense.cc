// matmul (cuBLASLt, TF32 off: the CPU's f32 results), rotary_embedding and embedding on CUDA, each
// read as its CPU kernel reads its inputs and attributes.
#include "shardwise/core/error.h"
#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/cuda/gemm/matmul.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/rotary/kernels.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

cuda::MatmulOptions matmul_options(const Attrs& attrs) {
  cuda::MatmulOptions o;
  o.trans_x = attrs.get_bool("trans_x", false);
  o.trans_y = attrs.get_bool("trans_y", false);
  return o;
}

bool wants(std::span<const bool> wanted, size_t i) { return wanted.size() <= i || wanted[i]; }

void bind_matmul(ops::DeviceKernelTable& t) {
  t.add_forward("matmul", [](const OpDef&, In in, const Attrs& attrs, const KernelContext*) {
    return Tensors{cuda::matmul(in[0], in[1], matmul_options(attrs), current_stream())};
  });
  t.add_backward("matmul", [](const OpDef&, In in, In, In dout, const Attrs& attrs, const KernelContext*,
                              std::span<const bool> wanted) {
    cuda::MatmulGrads g = cuda::matmul_backward(in[0], in[1], dout[0], matmul_options(attrs), wants(wanted, 0),
                                                wants(wanted, 1), current_stream());
    return Tensors{g.dx, g.dy};
  });
}

double theta_of(const Attrs& attrs) { return attrs.get_float("theta", ops::kRopeTheta); }

void bind_rotary(ops::DeviceKernelTable& t) {
  t.add_forward("rotary_embedding", [](const OpDef&, In in, const Attrs& attrs, const KernelContext*) {
    return Tensors{cuda::rotary_embedding(in[0], in[1], theta_of(attrs), current_stream())};
  });
  t.add_backward("rotary_embedding", [](const OpDef&, In in, In, In dout, const Attrs& attrs, const KernelContext*,
                                        std::span<const bool>) {
    return Tensors{cuda::rotary_embedding_backward(dout[0], in[1], theta_of(attrs), current_stream()), Tensor()};
  });
}

// The vocab block of the local weight: its first row and the whole vocabulary (the context's entry
// of the weight, as the CPU op's vocab_block; one device: 0 and the weight's rows).
struct VocabBlock {
  int64_t offset = 0, size = 0;
};
VocabBlock vocab_block(const KernelContext* ctx, const Shape& weight) {
  if (ctx == nullptr || ctx->tensors.size() < 2 || ctx->tensors[1].global_shape.ndim() != 2) return {0, weight[0]};
  return {ctx->tensors[1].offset[0], ctx->tensors[1].global_shape[0]};
}

void bind_embedding(ops::DeviceKernelTable& t) {
  t.add_forward("embedding", [](const OpDef&, In in, const Attrs&, const KernelContext* ctx) {
    const VocabBlock b = vocab_block(ctx, in[1].shape());
    return Tensors{cuda::embedding(in[0], in[1], b.offset, b.size, current_stream())};
  });
  t.add_backward("embedding", [](const OpDef& op, In in, In, In dout, const Attrs&, const KernelContext* ctx,
                                 std::span<const bool>) {
    SW_CHECK(in[1].defined(), "op '{}' on {}: the backward needs the weight's shape", op.name,
             dout[0].device().to_string());
    const VocabBlock b = vocab_block(ctx, in[1].shape());
    return Tensors{Tensor(), cuda::embedding_backward(in[0], dout[0], in[1].shape(), b.offset, b.size, current_stream())};
  });
}

}  // namespace

void bind_dense(ops::DeviceKernelTable& t) {
  bind_matmul(t);
  bind_rotary(t);
  bind_embedding(t);
}

}  // namespace shardwise::cuda_ops
