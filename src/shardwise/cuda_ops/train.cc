// The optimizer's kernels on CUDA (ops/train_kernels.h): AdamW through cuda::adamw_update (the bf16
// copy of the master in the same kernel), each gradient's sum of squares as an f32 square and sum
// (the host reads all of them in one copy), scaling and the gradient sums through the elementwise
// kernels. Compiled only: never run on a GPU (docs/gpu.md).
#include <vector>

#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::cuda_ops {

namespace {

void cuda_adamw(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const ops::AdamWHyper& h,
                Tensor* bf16_param) {
  const cuda::AdamWArgs args{h.beta1, h.beta2, h.epsilon, h.weight_decay, h.lr, h.step, h.decay};
  cuda::adamw_update(master, exp_avg, exp_avg_sq, grad, args, current_stream(), bf16_param);
}

// [n] f32: each gradient's sum of squares (f32 sums in the reduction's order, not the CPU's double blocks).
Tensor cuda_squares(std::span<const Tensor> grads) {
  const Stream s = current_stream();
  std::vector<Tensor> sums;
  for (const Tensor& g : grads) {
    const Tensor sq = cuda::binary(cuda::Binary::Mul, g, g, s);
    sums.push_back(cuda::reduce_sum(sq.reshaped(Shape{g.numel()}), 1u, false, s).reshaped(Shape{1}));
  }
  return cuda::concat(sums, 0, s);
}

void cuda_scale(Tensor& t, float scale) { t = cuda::scale(t, scale, 0.0, true, current_stream()); }

void cuda_accumulate(Tensor& sum, const Tensor& g) {
  const Stream s = current_stream();
  const Tensor add = g.dtype() == DType::F32 ? g : cuda::cast(g, DType::F32, s);
  if (!sum.defined()) {
    sum = g.dtype() == DType::F32 ? cuda::copy(g, s) : add;
    return;
  }
  sum = cuda::binary(cuda::Binary::Add, sum, add, s);
}

}  // namespace

void bind_train(ops::DeviceKernelTable& t) {
  t.set_train_kernels({cuda_adamw, cuda_squares, cuda_scale, cuda_accumulate});
}

}  // namespace shardwise::cuda_ops
