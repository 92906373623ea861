#pragma once
// Sharded optimizer state over the data-parallel dims (ZeRO / PaddlePaddle sharding), stages 1 and 2.
// (Stage 3 needs no ShardedOptimizer: the parameters themselves are Shard over dp, see
// ShardingConfig::shards_params and graph::shard_params_over, so each rank's blocks are its shards.)
//
// Each parameter has a data group: the ranks of the data dims (dp, ep) that replicate its block, whose
// gradient is a sum over them (data_group_dims): dense parameters dp x ep, MoE experts (S(0) on ep)
// dp only, as Megatron's distributed optimizer shards dense state over the data-parallel group and
// the experts' over the expert-data-parallel one. Every rank of a group holds the same blocks of its
// parameters (its tp / pp blocks); the group splits the optimizer state of those blocks among its
// ranks, each group planned on its own (its parameters in params() order). Each block is seen as a row-major flat
// array, and each dp rank owns one contiguous range of it (possibly empty), ranks in dp order:
//   - layout v1: each parameter owned whole by one dp rank, assigned greedily by elements (largest
//     first, to the least-loaded rank; ties to the lower index / rank);
//   - layout v2 (split-param): the rank's parameters concatenated in params() order into one flat
//     buffer, cut into dp ranges whose sizes differ by at most one element: a parameter may be cut
//     mid-tensor.
// A rank keeps the AdamW moments (and, for bf16 parameters, the fp32 master) of its ranges only,
// as 1-D tensors; an f32 parameter's master is the parameter itself (its range of `param`).
//
// The step: stage 1 takes the graph's all-reduced gradients and reads its ranges; stage 2 takes
// gradients the graph left Partial over dp (pipeline::StageSpec::partial_grad_dims) and
// reduce-scatters them into the ranges, dropping the full sums. The norm counts each element once
// (global_grad_norm with dp as the disjoint dim); each rank updates its ranges (AdamW::update) and
// the parameters are all-gathered over dp (v1: the owner's whole block, a broadcast).
// State on a device stays there: the ranges are device copies, the collectives run on device memory
// (comm::DeviceBuffers on the current stream) and the update is the device's AdamW kernel, the same
// bits as the host's. A checkpoint load runs on the host (gather_params refuses device state).
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/train/optimizer.h"

namespace shardwise::train {

struct ShardingConfig {
  int stage = 0;              // 0: none; 1: optimizer state; 2: and gradients; 3: and parameters
  std::string layout = "v1";  // v1 or v2 (split-param); stage 3 ignores it (see below)
  // Error naming what is wrong.
  void check() const;
  bool enabled() const { return stage > 0; }
  // Stages 1 and 2: a ShardedOptimizer over the ranges of `layout`.
  bool shards_optimizer() const { return stage == 1 || stage == 2; }
  // Stage 3 (FSDP): the parameters themselves are Shard over their data dims (dp, and ep for dense
  // parameters: pipeline::StageSpec::shard_params_dims);
  // each rank's blocks are its shards, so the plain optimizer is already sharded and `layout` plays
  // no part (every parameter is cut by rows, dim 0 of its tp block, in data-group chunks).
  bool shards_params() const { return stage == 3; }
  // Stage 3: the all-gathers of this many layers ahead are started before the current layer
  // computes, in forward and backward (runtime::RuntimeOptions::prefetch_params; 0: off).
  int prefetch_params = 0;
  bool operator==(const ShardingConfig&) const = default;
};

// A parameter's data group: of `data_dims` (the mesh's dp and ep dims, those it has), the ones on
// which `dist` replicates the block, in mesh-dim order.
std::vector<int> data_group_dims(const mesh::DistAttr& dist, std::span<const int> data_dims);

// Which flat range of each parameter's block each rank of its data group owns.
struct ShardPlan {
  std::vector<std::vector<int64_t>> counts;  // per parameter, per rank of its group: elements owned
  std::vector<int> ranks;                    // per parameter: this rank's index in its group
  int64_t begin(size_t i) const;             // where this rank's range of parameter i starts
  int64_t count(size_t i) const { return counts[i][static_cast<size_t>(ranks[i])]; }
  int64_t owned_elements() const;            // over every parameter
};
// A 1-D copy of elements [begin, begin + n) of `t` (row-major), where `t` is (a device copy on the
// current stream for a device tensor).
Tensor flat_range(const Tensor& t, int64_t begin, int64_t n);

// `numels`: each parameter's block size on this rank; one group of `dp` ranks, this one `rank`.
ShardPlan plan_shards(const std::string& layout, const std::vector<int64_t>& numels, int dp, int rank);
// Several groups: parameter i in group `group_of[i]` of `sizes[g]` ranks, this rank `ranks[g]` in
// it; each group's parameters planned as one (plan_shards over them alone, in their order).
ShardPlan plan_shards(const std::string& layout, const std::vector<int64_t>& numels, const std::vector<int>& group_of,
                      const std::vector<int>& sizes, const std::vector<int>& ranks);

// The data groups of a rank's parameters: the communicators and each parameter's.
struct DataGroups {
  std::vector<std::shared_ptr<comm::Communicator>> comms;  // per group
  std::vector<std::vector<int>> dims;                      // per group: its mesh dims
  std::vector<int> of;                                     // per parameter: its group
  bool any_shared() const;  // a group of more than one rank
};

class ShardedOptimizer {
 public:
  // Cuts each parameter's master and moments to this rank's ranges. `groups`: each parameter's
  // data group (the ranks holding the same block).
  ShardedOptimizer(ShardingConfig config, std::vector<ParamState>& params, DataGroups groups);

  const ShardingConfig& config() const { return c_; }
  const ShardPlan& plan() const { return plan_; }
  const DataGroups& groups() const { return g_; }

  // This rank's ranges of the gradients (1-D f32, per parameter): stage 1 reads them from the
  // all-reduced blocks; stage 2 reduce-scatters over its group each block marked `partial`
  // (Partial(sum) over its group's dims) and releases every full block (`grads` is emptied).
  std::vector<Tensor> reduce(std::vector<Tensor>& grads, const std::vector<bool>& partial);
  // AdamW on this rank's ranges, then every parameter's `param` all-gathered over its group.
  void step(const AdamW& adamw, std::vector<ParamState>& params, const std::vector<Tensor>& owned, double lr,
            int64_t step);

  // Collective over parameter i's group: the whole block from each rank's 1-D range `piece`.
  Tensor whole(size_t i, const Tensor& piece, const Shape& block_shape);
  // Collective over the groups: every bf16 parameter's `param` rebuilt from the ranks' ranges of its master
  // (rounded, all-gathered), as after a step; f32 parameters are their own masters and stay. A
  // checkpoint load fills only each rank's ranges (train/checkpointing.cc), then calls this.
  void gather_params(std::vector<ParamState>& params);

 private:
  comm::Communicator& group_of(size_t i) { return *g_.comms[static_cast<size_t>(g_.of[i])]; }
  // step() of parameter i whose state is on a device.
  void step_on_device(const AdamW& adamw, size_t i, ParamState& p, const Tensor& owned, double lr, int64_t step);
  ShardingConfig c_;
  DataGroups g_;
  ShardPlan plan_;
};

}  // namespace shardwise::train
