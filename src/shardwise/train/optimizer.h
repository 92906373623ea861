#pragma once
// AdamW with fp32 master weights, the learning-rate schedule and global-norm gradient clipping.
// Every rank updates its own block of each parameter: the update is elementwise, so any sharding
// computes exactly the single-device numbers.
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/ops/train_kernels.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8;
  double weight_decay = 0.1;  // applied to matrices (rank >= 2) only
  bool operator==(const AdamWConfig&) const = default;
};

// Linear warm-up from 0 to `peak` over `warmup` steps, then cosine decay to `floor` at `total`.
struct LrSchedule {
  double peak = 1e-3, floor = 1e-4;
  int64_t warmup = 10, total = 100;
  double at(int64_t step) const;  // step counts from 0
};

// One parameter's state on this rank: its block (in the dtype the model computes in), the fp32
// master copy and the two moments, all laid out like the parameter. A frozen parameter (LoRA's
// base) holds `param` only: no master, no moments.
struct ParamState {
  std::string name;
  mesh::DistAttr dist;
  mesh::ProcessMesh mesh;  // where `dist` lays it out: the run's mesh, or a pipeline stage's sub-mesh
  Shape shape;             // the whole parameter
  Tensor param;   // what the kernels read (f32, or bf16 with fp32 masters)
  Tensor master;  // f32
  Tensor exp_avg, exp_avg_sq;  // f32
  bool decay = false;
};

// Whether `p` holds an fp32 master apart from the kernels' copy (bf16 parameters); an f32
// parameter is its own master. On the host or a device.
bool has_own_master(const ParamState& p);

class AdamW {
 public:
  explicit AdamW(AdamWConfig config) : c_(config) {}
  // One update of every parameter with `grads` (f32 blocks, same order); step counts from 1. State on
  // a device updates there (ops::adamw_on_device), a bf16 parameter's copy in the same kernel.
  void step(std::vector<ParamState>& params, const std::vector<Tensor>& grads, double lr, int64_t step) const;
  // The update of `n` elements in place (master `w`, moments `m`, `v`, gradient `g`): what step()
  // does to each parameter, for callers that own a part of one (the sharded optimizer).
  void update(float* w, float* m, float* v, const float* g, int64_t n, bool decay, double lr, int64_t step) const;
  const AdamWConfig& config() const { return c_; }
  // The kernel's numbers for one update (ops/train_kernels.h).
  ops::AdamWHyper hyper(bool decay, double lr, int64_t step) const;

 private:
  AdamWConfig c_;
};

// The global L2 norm of the gradients, whatever their sharding: each rank sums the squares of its
// blocks, weighted by 1 / (number of ranks holding the same block), and one all_reduce over the
// world adds them up. Every rank gets the same bits.
// `disjoint_dims`: mesh dims whose ranks hold disjoint parts of each gradient instead of replicas
// (the data dims dp and ep under sharding: each rank's `grads[i]` is its shard), not counted as replicas.
double global_grad_norm(const std::vector<ParamState>& params, const std::vector<Tensor>& grads,
                        const mesh::ProcessMesh& mesh, comm::Communicator& world,
                        const std::vector<int>& disjoint_dims = {});
// g *= scale for every gradient (f32, on the host or a device): the mean over micro-batches, clipping.
void scale_grads(std::vector<Tensor>& grads, float scale);
// Scales the gradients so that their global norm is at most `max_norm` (<= 0: no clipping).
// Returns the norm before clipping.
double clip_grad_norm(std::vector<Tensor>& grads, double norm, double max_norm);

}  // namespace shardwise::train
