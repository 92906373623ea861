#pragma once
// Mixture of experts: a SwiGLU MoE MLP over tokens (Mixtral's block_sparse_moe), forward and
// backward, with its expert-parallel dispatch.
//
//   moe_mlp(x [N, d], gate [E, d], w1 [E, F, d], w3 [E, F, d], w2 [E, d, F]; top_k, capacity_factor,
//           normalize) -> (out [N, d], aux_loss [], z_loss [], dropped [] i64, expert_tokens [E] i64)
//
// Routing (Mixtral's order): logits = x gate^T, p = softmax over all E experts, the top_k experts
// by p (ties: the lower expert index), their weights p renormalised to sum 1 (normalize=true;
// Qwen-MoE's norm_topk_prob=false keeps p). router=sigmoid (DeepSeek-V3's gating): p = sigmoid of
// each logit instead of the softmax, the rest alike (the aux loss's P_i the mean sigmoid score; the
// z-loss still of the logits' logsumexp). Expert e on its rows X: Y = (silu(X w1_e^T) *
// (X w3_e^T)) w2_e^T; out_t = sum over the token's kept slots of weight * Y.
// aux_loss = E * sum_i f_i P_i with f_i = (assignments to expert i) / N, P_i = mean_t p_ti
// (Switch / GShard; transformers' load_balancing_loss_func); z_loss = mean_t logsumexp_t^2
// (ST-MoE). Both count every assignment, dropped or not. Their coefficients belong to the model.
// capacity_factor > 0: each expert keeps at most C = ceil(capacity_factor * N * top_k / E)
// assignments, by priority (slot, token): every token's first choice before any second choice,
// then token order (GShard); the others are dropped (that slot adds nothing; weights are not
// renormalised again) and counted in `dropped`. capacity_factor = 0: dropless. expert_tokens[i]:
// the assignments the router gave expert i over every token (before capacity; they sum to N *
// top_k): the load-balance figure of the training metrics. dropped and expert_tokens have no gradient.
//
// bf16 x, w1, w3, w2 with an f32 gate (`--compute bf16`): every expert GEMM reads bf16 operands and
// sums in f32, as cuBLASLt's bf16 GEMM with f32 output: h1, h3, y and the gradient GEMMs' results are
// f32, a = silu(h1) * h3 is rounded to bf16 before y's GEMM, and backward dy = dout * weight and
// dh1, dh3 before theirs. The router widens x to f32 (exact) with the gate f32; out, aux_loss and
// z_loss are f32 (moe_output_dtype; dout too), dx, dw1, dw3, dw2 rounded once to bf16, dgate f32.
// The CPU widens the bf16 inputs to f32 and runs the f32 kernel with those roundings.
//
// Sharding (the rule in rules.cc): x may be split on its token dim over mesh dims T; the experts
// on their expert dim over mesh dims X, a subset of T (ep over the token ranks). The kernel
// all-gathers each token block's per-expert counts and probability sums over T (the aux loss and
// capacity positions are global), then, within X, all-gathers every rank's expert range and
// per-expert counts, sends each kept assignment's row to the rank owning its expert with one
// all_to_all_v (or, on one node, writes it into that rank's shared memory: MoeExchange), runs
// each local expert as one GEMM chain over the rows it received (an empty expert costs nothing)
// and returns the results by the inverse all_to_all_v (or reads them there). Backward the same:
// rows [x, dout, weight] out, [dx, dweight] back. On one device (null groups) it is the same code
// with every exchange a copy.
#include <cstdint>

#include "shardwise/comm/communicator.h"
#include "shardwise/core/attrs.h"
#include "shardwise/ops/moe/moves.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

struct MoeConfig {
  int64_t top_k = 2;
  double capacity_factor = 0.0;  // 0: dropless
  bool normalize = true;         // renormalise the top-k weights to sum 1
  bool sigmoid = false;          // gate scores sigmoid(logit) per expert instead of the softmax over E
};
// Reads top_k (required), capacity_factor (default 0), normalize (default true), router ("softmax",
// the default, or "sigmoid"); Error on bad values.
MoeConfig moe_config(const Attrs& attrs, int64_t experts);

// Checks shapes and dtypes (f32 or f64, all the same; or x, w1, w3, w2 bf16 with an f32 gate);
// Error names the input and what is allowed.
void check_moe_inputs(const Shape& x, const Shape& gate, const Shape& w1, const Shape& w3, const Shape& w2,
                      std::span<const DType> dtypes);
// Its dtype part alone (x, gate, w1, w3, w2), for kernels on local blocks.
void check_moe_dtypes(std::span<const DType> dtypes);
// The dtype of out, aux_loss and z_loss (and of their gradients): f32 for bf16 x, else x's.
DType moe_output_dtype(DType x_dtype);

// How the expert group's rows travel. Messages: all_to_all_pieces (any backend). Shared: each
// rank writes its rows straight into the node-shared region of the rank owning their expert and
// reads its results from there (Communicator::shared_regions; no messages, two barriers a call).
// Auto: the environment's SHARDWISE_MOE_EXCHANGE (messages or shared; unset or empty: shared where
// the group has shared regions, else messages). Shared where the group has none is an Error.
enum class MoeExchange : uint8_t { Auto, Messages, Shared };
// SHARDWISE_MOE_EXCHANGE read up front (a model with experts checks it before training, so a bad
// value is a usage error, not a failure at the first MoE layer): Error on a value other than
// messages, shared or empty.
void check_moe_exchange_setting();

// Where this rank's blocks sit: the token block [token_offset, +N_local) of `tokens_total` and the
// expert block [expert_offset, +E_local) of the gate's E, and the groups the kernel talks to
// (null: one rank). One device: offsets 0, totals the local sizes, no groups.
struct MoeShard {
  int64_t token_offset = 0;
  int64_t tokens_total = -1;  // -1: x's local N
  int64_t expert_offset = 0;
  comm::Communicator* token_group = nullptr;   // the ranks holding the other token blocks
  comm::Communicator* expert_group = nullptr;  // the ranks holding the other expert blocks
  MoeExchange exchange = MoeExchange::Auto;    // the same on every rank of the expert group
  const MoeMoves* moves = nullptr;             // null: host buffers; else the exchanges on a device's (moves.h)
};

struct KernelContext;
// The shard of a call in context (ops.cc): x's token block and w1's expert block with their groups
// (the expert-sharding mesh dims must also split the tokens: an Error otherwise). No moves.
MoeShard moe_shard_of(const KernelContext& ctx);
// The same for a device's binding: no context, one device; a group of one rank dropped (nothing to
// gather or move, so nothing for the host to read; the CPU kernel gives the same numbers either way).
MoeShard moe_device_shard_of(const KernelContext* ctx);

struct MoeGrads {
  Tensor dx, dgate, dw1, dw3, dw2;
};

// Inputs: x, gate, w1, w3, w2 (local blocks). Outputs: out, aux_loss, z_loss, dropped, expert_tokens.
std::vector<Tensor> moe_forward(std::span<const Tensor> in, const MoeConfig& cfg, const MoeShard& shard);
// dout: out's gradient; daux, dz: scalar gradients of aux_loss and z_loss (undefined: 0).
MoeGrads moe_backward(std::span<const Tensor> in, const Tensor& dout, const Tensor& daux, const Tensor& dz,
                      const MoeConfig& cfg, const MoeShard& shard);

}  // namespace shardwise::ops
