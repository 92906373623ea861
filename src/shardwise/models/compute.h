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
#include <functional>
#include <string>
#include <vector>

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

// Sequence parallelism under bf16 compute (training, no LoRA, outside a fully recomputed layer):
// a norm's output is cast to bf16 on its sequence shard and gathered after the cast (half the
// bytes of gathering f32), and the column-parallel matmuls reading it run in a recompute segment
// (Graph::begin_segment), so their backward gathers the shard again instead of every frame
// keeping the whole-sequence copy: what Megatron-LM's sequence parallelism keeps (Korthikanti et
// al. section 4.2.2), at one more all-gather per matmul group in the backward.
bool regathers_sp_inputs(const graph::Graph& g, const GptConfig& config, const Strategy& s, bool training);

// Under sequence parallelism, a norm output's placements: whole on tp (gathered for the
// column-parallel matmuls), or its sequence shard where regathers_sp_inputs casts it first.
std::string sp_norm_placements(const graph::Graph& g, const GptConfig& config, const Strategy& s, bool training);

// The column-parallel matmuls `matmuls` on a norm's output `h`: matmuls(h), or under
// regathers_sp_inputs `h` cast to bf16 on its sequence shard, then a reshape of it to its own
// shape (a gradient that reads no value) laid out whole on tp, which `matmuls` read, the reshape
// and the matmuls in a recompute segment: the all-gather lands between the cast and the reshape
// and is redone before the matmuls' backward. With `recompute_cast` the cast is in the segment
// too (recomputed from `h`, for a norm whose f32 output its own gradient keeps: RMSNorm's); else
// the frame keeps the bf16 shard (LayerNorm's gradient reads its input, not its output).
std::vector<graph::ValueId> on_gathered(graph::Graph& g, const GptConfig& config, const Strategy& s, bool training,
                                        graph::ValueId h, bool recompute_cast,
                                        const std::function<std::vector<graph::ValueId>(graph::ValueId)>& matmuls);

}  // namespace shardwise::train
