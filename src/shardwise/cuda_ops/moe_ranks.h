#pragma once
// moe_mlp's routing and row moves on CUDA (moe.cc), on one device or with the tokens or experts
// over ranks. Over ranks, as the CPU kernel (ops/moe/kernels.h): the router on the device over this
// rank's tokens; its block of the router's sums (counts per slot and expert, sums of p, of lse^2)
// made on the device and all-gathered over the token ranks on device memory, then read on the host
// once (one counted copy: every size below comes from it); the global sums, aux and z losses and
// expert counts in the CPU's order from them (moe_detail::sum_blocks, aux_loss_of, z_loss_of; three
// small copies to the device); the rows moved to the experts' ranks and back by all_to_all_pieces
// on device buffers (comm::DeviceBuffers on the current stream), landing expert-major as the CPU's.
// Not built over ranks: capacity (capacity_factor > 0), an Error naming it.
#include <cstdint>
#include <optional>
#include <vector>

#include "shardwise/cuda/layers/moe.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/ops/moe/routing.h"

namespace shardwise::cuda_ops {

struct MoeRanks {
  ops::MoeShard shard;
  ops::moe_detail::DispatchPlan plan;  // sizes only (the router's decisions stay on the device)
};

// One call's routing: r (over ranks: with the global losses, counts and token total), the local
// dispatch d in send order, and the rows each local expert receives.
struct MoeRouted {
  cuda::MoeRouting r;
  cuda::MoeDispatch d;
  std::vector<int64_t> expert_rows;
  std::optional<MoeRanks> ranks;  // none: one device
};
// x32: x as the router reads it (f32).
MoeRouted moe_route_call(const OpDef& op, In in, const Tensor& x32,
                         const cuda::MoeRouterConfig& config, const KernelContext* ctx);

// f32 rows [send rows, w] in d's order to the local experts' rows [received, w], expert-major;
// moe_from_experts the reverse. One device (or no expert group): the rows themselves.
Tensor moe_to_experts(const MoeRouted& routed, const Tensor& rows);
Tensor moe_from_experts(const MoeRouted& routed, const Tensor& rows);

}  // namespace shardwise::cuda_ops
