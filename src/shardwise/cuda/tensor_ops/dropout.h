#pragma once
// ops::dropout / dropout_backward on device tensors (f32, bf16, f16): the keep mask of element g
// (its global row-major index in the whole tensor of `global_shape`, x being the block at `offset`)
// is Philox(seed, stream).uniform(g) >= p, core/philox.h's stream, so the GPU's mask equals the CPU's
// bit for bit whatever the sharding; out = x * mask / (1 - p). Not training: out = a copy of x and
// the mask all ones.
#include <cstdint>
#include <span>

#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

struct DropoutOptions {
  double p = 0.5;
  uint64_t seed = 0, stream = 0;
  bool training = true;
};
struct DropoutResult {
  Tensor out, mask;  // mask: u8, 1 = kept
};
DropoutResult dropout(const Tensor& x, const Shape& global_shape, std::span<const int64_t> offset,
                      const DropoutOptions& options, Stream stream = {});
// dx = dy * mask / (1 - p) (training), a copy of dy (not training).
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, const DropoutOptions& options, Stream stream = {});

}  // namespace shardwise::cuda
