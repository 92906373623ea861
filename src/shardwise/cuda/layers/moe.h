#pragma once
// The MoE layer's routing and dispatch on one device (moe_routing.cu, moe_dispatch.cu): the CUDA
// twins of ops/moe's router (moe_detail::route), its dispatch plan (plan_dispatch with one rank),
// the row gather and the weighted combine, and the gradients of all of them (moe_backward's router
// and row movement). The experts' GEMMs between gather and combine are not here (cuBLASLt's).
// x f32 [N, d], gate f32 [E, d] with E <= 1024; router values f64 as the CPU keeps them.
#include <cstdint>
#include <vector>

#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda {

struct MoeRouterConfig {
  int64_t top_k = 2;
  double capacity_factor = 0.0;  // 0: dropless
  bool normalize = true;         // renormalise the top-k weights to sum 1
  bool sigmoid = false;          // sigmoid(logit) per expert instead of the softmax over E
};

// logits = x gate^T, p = softmax (sigmoid), lse; the top_k experts by p (ties: the lower index) and
// their weights; kept: whether capacity keeps each assignment (by (slot, token) priority: every
// first choice before any second, then token order); expert_tokens: assignments per expert before
// capacity; dropped; aux_loss = E sum_i f_i P_i, z_loss = mean lse^2 (ops/moe/kernels.h).
struct MoeRouting {
  MoeRouterConfig config;
  Tensor logits, probs, lse;  // f64 [N, E], [N, E], [N]
  Tensor expert, weight;      // i64 [N, k], f64 [N, k]
  Tensor kept;                // u8 [N, k]
  Tensor expert_tokens;       // i64 [E]
  Tensor dropped;             // i64 []
  Tensor aux_loss, z_loss;    // f32 []
  // The tokens the losses' gradients divide by (moe_router_backward): every rank's when the tokens
  // are split over ranks (expert_tokens then the global counts too); -1: x's.
  int64_t tokens_total = -1;
};
MoeRouting moe_route(const Tensor& x, const Tensor& gate, const MoeRouterConfig& config, Stream stream = {});

// Where each kept assignment's row goes: experts in order, each expert's assignments in order.
// expert_rows is read back to the host (a synchronisation: the experts' GEMMs need their sizes).
struct MoeDispatch {
  Tensor pos;                        // i64 [N, k]: the row, -1 when dropped
  std::vector<int64_t> expert_rows;  // [E]
  int64_t rows = 0;                  // their sum
};
MoeDispatch moe_plan(const MoeRouting& r, Stream stream = {});
// The same plan with expert_rows known on the host (from the gathered counts, tokens over ranks):
// nothing is read back.
MoeDispatch moe_plan(const MoeRouting& r, std::vector<int64_t> expert_rows, Stream stream = {});
// This token block's row of the router's sums over ranks (ops/moe/routing.h, Routing::block_sums):
// f64 [3 + top_k E + E + 1] = [token offset, expert offset, local experts, counts [top_k][E],
// sums of p [E], sum of lse^2], each summed over the tokens in the CPU's order.
Tensor moe_block_sums(const MoeRouting& r, int64_t token_offset, int64_t expert_offset, int64_t local_experts,
                      Stream stream = {});
// The experts' input rows [rows, d]: x's row of each kept assignment.
Tensor moe_gather(const Tensor& x, const MoeDispatch& d, Stream stream = {});
// out[t] = sum over t's kept slots, in slot order and double, of weight * y[pos] (y [rows, d]).
Tensor moe_combine(const Tensor& y, const MoeDispatch& d, const MoeRouting& r, Stream stream = {});

// The combine's gradient: dy [rows, d] = dout[t] * weight (the experts' output gradient) and
// dweight f64 [N, k] = dout[t] . y[pos] (0 where dropped).
struct MoeCombineGrad {
  Tensor dy, dweight;
};
MoeCombineGrad moe_combine_backward(const Tensor& dout, const Tensor& y, const MoeDispatch& d, const MoeRouting& r,
                                    Stream stream = {});
// x's and the gate's gradients: dx = the sum over t's kept slots of dx_rows (the experts' input
// gradient [rows, d]) plus the router's, through dweight and the aux / z losses' gradients (f32
// device scalars, or undefined: 0).
struct MoeRouterGradResult {
  Tensor dx, dgate;
};
MoeRouterGradResult moe_router_backward(const Tensor& x, const Tensor& gate, const MoeRouting& r, const MoeDispatch& d,
                                        const Tensor& dx_rows, const Tensor& dweight, const Tensor& daux,
                                        const Tensor& dz, Stream stream = {});

}  // namespace shardwise::cuda
