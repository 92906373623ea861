#pragma once
// The compute dtype of the model builders (GptConfig::compute_dtype, `train --compute`): f32, or
// bf16 the way PyTorch's autocast and Megatron-LM's bf16 runs compute: the operands of every GEMM
// (attention projections, MLPs, the LM head, MoE experts, LoRA's adapters) and of the attention
// core (q, k, v) in bf16, each product accumulated in f32 by its kernel and rounded once to bf16
// (autocast's output dtype), then taken back to f32; the fused LM head and moe_mlp keep their
// products f32 between their GEMMs and give f32 losses and outputs (their headers say where they
// round to bf16). Everything between the GEMMs stays f32, as autocast's
// fp32 list and Megatron keep it: the residual stream (Megatron's fp32_residual_connection), the
// norms' statistics and outputs, biases, activations, softmax, the router and the loss. Parameters
// may be stored in f32 (cast to bf16 where a GEMM reads them) or bf16 (--bf16: read as stored).
#include <string>

#include "shardwise/graph/graph.h"
#include "shardwise/models/gpt.h"

namespace shardwise::train {

bool computes_bf16(const GptConfig& config);

// `v` as a GEMM or attention operand: itself in f32 compute; under bf16 compute its bf16 cast
// (one per value: a value read by several GEMMs, as the q/k/v projections' input, is cast once),
// or, for a bf16 value cast to f32 (a --bf16 parameter as the f32 kernels read it), that bf16
// value itself: the round trip is exact, so no cast is added.
graph::ValueId compute_operand(graph::Graph& g, const GptConfig& config, graph::ValueId v);

// A compute-dtype result back in f32 (named `name`); `v` itself when it is f32 already.
graph::ValueId compute_result(graph::Graph& g, graph::ValueId v, const std::string& name);

// matmul(x, y) with both operands in the compute dtype, the product ("<name>.bf16" under bf16
// compute) back in f32 as `name`.
graph::ValueId compute_matmul(graph::Graph& g, const GptConfig& config, graph::ValueId x, graph::ValueId y,
                              bool trans_y, const std::string& name);

}  // namespace shardwise::train
