#pragma once
// Kernels of the gated activations. swiglu(gate, up) = silu(gate) * up, the SwiGLU MLP of Llama
// (down_proj(silu(gate_proj(x)) * up_proj(x))), fused so the activation reads each input once
// and its gradient needs no saved silu(gate). Floats only; f16 / bf16 compute in float.
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// Error naming the op unless gate and up have one shape and one floating dtype.
void check_swiglu_inputs(const Shape& gate, DType gate_dtype, const Shape& up, DType up_dtype);

// out = silu(gate) * up, where silu(g) = g * sigmoid(g).
Tensor swiglu(const Tensor& gate, const Tensor& up);

struct SwigluGrads {
  Tensor dgate;  // dout * up * silu'(g), silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
  Tensor dup;    // dout * silu(g)
};
SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout);

}  // namespace shardwise::ops
