#pragma once
// Host side of the kernels' walks (tensor_launchers.h): element types from dtypes, and walks
// merging dims that every operand walks contiguously (fewer divisions per element).
#include <array>
#include <string_view>

#include "shardwise/cuda/common/tensor_launchers.h"
#include "shardwise/tensor/broadcast.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda::detail {

// f32 / bf16 / f16, else an Error naming the kernel and the argument.
inline launch::Elem elem_of(std::string_view kernel, std::string_view arg, const Tensor& t) {
  SW_CHECK(t.defined() && t.on_device() &&
               (t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16),
           "cuda {}: {} must be a f32, bf16 or f16 tensor on a device, got {}", kernel, arg,
           t.defined() ? t.to_string(0) : std::string("an undefined tensor"));
  return t.dtype() == DType::F32 ? launch::Elem::F32 : t.dtype() == DType::BF16 ? launch::Elem::BF16 : launch::Elem::F16;
}

// A walk over `shape` with operand k's strides; dims of extent 1 dropped, and a dim merged into the
// next when every operand steps over the pair as one dim.
inline launch::Walk make_walk(const Shape& shape, std::initializer_list<std::array<int64_t, kMaxDims>> strides) {
  launch::Walk w;
  for (int d = 0; d < shape.ndim(); ++d) {
    if (shape[d] == 1) continue;
    const auto du = static_cast<size_t>(d);
    bool merge = w.ndim > 0;
    int k = 0;
    for (const auto& st : strides) merge = merge && w.stride[k++][w.ndim - 1] == st[du] * shape[d];
    if (merge) {
      w.shape[w.ndim - 1] *= shape[d];
      k = 0;
      for (const auto& st : strides) w.stride[k++][w.ndim - 1] = st[du];
      continue;
    }
    w.shape[w.ndim] = shape[d];
    k = 0;
    for (const auto& st : strides) w.stride[k++][w.ndim] = st[du];
    ++w.ndim;
  }
  if (shape.numel() == 0) {  // nothing to walk
    w.ndim = 1;
    w.shape[0] = 0;
  }
  return w;
}

}  // namespace shardwise::cuda::detail
