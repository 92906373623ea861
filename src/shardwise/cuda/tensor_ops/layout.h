#pragma once
// Reductions and layout kernels on device tensors, each the CUDA twin of a CPU kernel: sum / mean
// over a set of dims (ops::reduce, its float sums in double), the sum of a broadcast gradient back
// to an operand's shape (reduce_to_shape), and copies (ops::transpose, slice and its backward,
// concat, split, expand, a contiguous copy). The copies take any dtype; the sums f32, bf16, f16.
#include <span>
#include <vector>

#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

// Bit d of `mask` set: dim d is reduced (mask 0: every dim, as ops::reduce's empty axis list).
Tensor reduce_sum(const Tensor& x, uint32_t mask, bool keepdim, Stream stream = {});
// The mean over an empty extent is NaN (0 / 0), as the CPU's.
Tensor reduce_mean(const Tensor& x, uint32_t mask, bool keepdim, Stream stream = {});
// grad (of a broadcast result) summed over the dims `shape` was broadcast along.
Tensor sum_to_shape(const Tensor& grad, const Shape& shape, Stream stream = {});

// Output dim j is input dim perm[j].
Tensor transpose(const Tensor& x, std::span<const int> perm, Stream stream = {});
// x[starts[d] : starts[d] + sizes[d]] on every dim (within x's extents).
Tensor slice(const Tensor& x, std::span<const int64_t> starts, std::span<const int64_t> sizes, Stream stream = {});
// Zeros of `x_shape` with dout pasted at `starts`.
Tensor slice_backward(const Tensor& dout, const Shape& x_shape, std::span<const int64_t> starts, Stream stream = {});
Tensor concat(std::span<const Tensor> xs, int axis, Stream stream = {});
std::vector<Tensor> split(const Tensor& x, int axis, std::span<const int64_t> sizes, Stream stream = {});
// x broadcast (NumPy) to `shape`, written out.
Tensor expand(const Tensor& x, const Shape& shape, Stream stream = {});
Tensor copy(const Tensor& x, Stream stream = {});

}  // namespace shardwise::cuda
