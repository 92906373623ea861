#pragma once
// The roles a training mesh's dims play, found by their names: the model builders annotate with it,
// the loader splits the batch by it, the trainer and the planners read it.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardwise/mesh/process_mesh.h"

namespace shardwise::mesh {

// Which mesh dims play which role: found by name ("dp", "tp", "pp", "ep") in the mesh. The data
// dims are dp and ep (Megatron's expert-data-parallel): the batch is split over both, in mesh-dim
// order, so every rank of dp x ep reads its own sequences; ep also splits the experts of MoE layers.
struct Strategy {
  ProcessMesh mesh;
  int dp = -1, tp = -1, pp = -1, ep = -1;
  bool sequence_parallel = false;
  static Strategy from_mesh(const ProcessMesh& mesh, bool sequence_parallel);
  int64_t dp_size() const { return dp < 0 ? 1 : mesh.dim_size(dp); }
  int64_t tp_size() const { return tp < 0 ? 1 : mesh.dim_size(tp); }
  int64_t ep_size() const { return ep < 0 ? 1 : mesh.dim_size(ep); }
  // The data dims (dp, ep): how many ways the batch is split, and which part a rank with mesh
  // coordinates `coords` holds (row-major over the data dims in mesh-dim order, as a co-sharded
  // S(0) splits it).
  int64_t data_size() const { return dp_size() * ep_size(); }
  int64_t data_index(std::span<const int64_t> coords) const;
  // The data dims the mesh has (dp, ep), in mesh-dim order.
  std::vector<int> data_dims() const;
  std::string to_string() const;
  // Placements text for the mesh: `on_tp` on the tp dim, `on_data` on the data dims (dp and ep), R
  // elsewhere ("S(0),S(1)").
  std::string placements(const char* on_tp, const char* on_data = "R") const;
};

}  // namespace shardwise::mesh
