#pragma once
// The roles a training mesh's dims play, found by their names: the model builders annotate with it,
// the loader splits the batch by it, the trainer and the planners read it.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardwise/mesh/process_mesh.h"

namespace shardwise::mesh {

// Which mesh dims play which role: found by name ("dp", "tp", "pp", "ep", "cp") in the mesh. The
// batch dims are dp and ep (Megatron's expert-data-parallel): the batch is split over both, in
// mesh-dim order, so every rank of dp x ep reads its own sequences; ep also splits the experts of
// MoE layers. cp (context parallelism) splits the sequence of every activation: the ranks of a cp
// group hold the same sequences, each a block of their tokens (S(1) on cp, in cp's balanced order:
// mesh/cp_order.h). Parameters are whole on cp and their gradients summed over it, as over dp: the
// data dims (gradient groups, sharded optimizer) are dp, ep and cp.
struct Strategy {
  ProcessMesh mesh;
  int dp = -1, tp = -1, pp = -1, ep = -1, cp = -1;
  bool sequence_parallel = false;
  static Strategy from_mesh(const ProcessMesh& mesh, bool sequence_parallel);
  int64_t dp_size() const { return dp < 0 ? 1 : mesh.dim_size(dp); }
  int64_t tp_size() const { return tp < 0 ? 1 : mesh.dim_size(tp); }
  int64_t ep_size() const { return ep < 0 ? 1 : mesh.dim_size(ep); }
  int64_t cp_size() const { return cp < 0 ? 1 : mesh.dim_size(cp); }
  // The batch dims (dp, ep): how many ways the batch is split, and which part a rank with mesh
  // coordinates `coords` holds (row-major over dp and ep in mesh-dim order, as a co-sharded S(0)
  // splits it). cp does not split the batch.
  int64_t data_size() const { return dp_size() * ep_size(); }
  int64_t data_index(std::span<const int64_t> coords) const;
  // The data dims the mesh has (dp, ep, cp), in mesh-dim order: each parameter's gradient is
  // summed over those that replicate it.
  std::vector<int> data_dims() const;
  std::string to_string() const;
  // Placements text for the mesh: `on_tp` on the tp dim, `on_data` on the batch dims (dp and ep),
  // `on_cp` on cp (null: S(1), the sequence of a [B, S, ..] activation, where on_data is S(0); R
  // otherwise), R elsewhere ("S(0),S(1)").
  std::string placements(const char* on_tp, const char* on_data = "R", const char* on_cp = nullptr) const;
};

}  // namespace shardwise::mesh
