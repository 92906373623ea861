#pragma once
// The op families' CUDA bindings (one file each), added to the table by cuda_kernel_table (bind.cc).
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/cuda/common/launchers.h"
#include "shardwise/ops/device_kernels.h"
#include "shardwise/ops/softmax/kernels.h"

namespace shardwise::cuda_ops {

using ops::KernelContext;
using ops::OpDef;
using Tensors = std::vector<Tensor>;
using In = std::span<const Tensor>;

// ctx, or the single-device context of `tensors` when the runtime gave none.
KernelContext context_or_single(const KernelContext* ctx, In tensors);
// An UnsupportedOnDevice (ops/device_kernels.h) naming the op, the device and the attribute
// combination the CUDA kernel lacks: the verifier counts it as skipped on CUDA.
[[noreturn]] void unsupported(const OpDef& op, const Tensor& on, std::string_view what);

// The CUDA kernels' reduction of a loss reduction.
cuda::launch::Reduction cuda_reduction(ops::LossReduction r);

// add, subtract, multiply, divide, scale, swiglu, softmax, cast (elementwise.cc).
void bind_elementwise(ops::DeviceKernelTable& t);
// sum, mean (reduce.cc).
void bind_reductions(ops::DeviceKernelTable& t);
// reshape, squeeze, unsqueeze, flatten (views), transpose, expand, concat (layout.cc).
void bind_layout(ops::DeviceKernelTable& t);
// matmul, rotary_embedding, embedding (dense.cc).
void bind_dense(ops::DeviceKernelTable& t);
// flash_attention, flash_attention_docs (attention.cc).
void bind_attention(ops::DeviceKernelTable& t);
// lm_head_cross_entropy, vocab_parallel_lm_head_cross_entropy (lm_head.cc).
void bind_lm_head(ops::DeviceKernelTable& t);
// The vocab-parallel head's combine (cuda::LmHeadOptions::combine): an all-reduce (max, or sum) of
// a device tensor of f64 row statistics in place over `group`, on device memory queued on the
// current stream (lm_head.cc).
std::function<void(Tensor&, bool)> vocab_stats_all_reduce(comm::Communicator* group);
// moe_mlp (moe.cc).
void bind_moe(ops::DeviceKernelTable& t);
// The optimizer's kernels: adamw, sums of squares, scale, gradient sums (train.cc).
void bind_train(ops::DeviceKernelTable& t);

}  // namespace shardwise::cuda_ops
