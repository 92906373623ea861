#pragma once
// An N-d arrangement of processes. Ranks are numbered row-major over the mesh shape: the rank
// index of coordinates (c0, c1, ...) is c0 * shape[1] * ... + c1 * ... ; process_ids[rank index]
// is the process (global rank) at those coordinates.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/shape.h"

namespace shardwise::mesh {

class ProcessMesh {
 public:
  ProcessMesh() = default;
  // process_ids defaults to 0..size-1; dim_names defaults to none (all empty).
  explicit ProcessMesh(const Shape& shape, std::vector<int64_t> process_ids = {},
                       std::vector<std::string> dim_names = {});

  int ndim() const { return shape_.ndim(); }
  const Shape& shape() const { return shape_; }
  int64_t dim_size(int mesh_dim) const;
  int64_t size() const { return static_cast<int64_t>(process_ids_.size()); }
  const std::vector<int64_t>& process_ids() const { return process_ids_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  // Index of a mesh dim by name ("tp") or by number ("1"); Error naming the known dims otherwise.
  int dim_index(std::string_view name_or_number) const;

  std::vector<int64_t> coords(int64_t rank_index) const;
  int64_t rank_index(std::span<const int64_t> coords) const;
  // Rank index of a process id; Error if the process is not in the mesh.
  int64_t rank_index_of_process(int64_t process_id) const;
  bool contains(int64_t process_id) const;
  // The process ids of the ranks that differ from `process_id`'s only along `mesh_dim`, by their
  // coordinate there (`process_id` itself alone when mesh_dim < 0): a dp or tp group.
  std::vector<int64_t> processes_along(int64_t process_id, int mesh_dim) const;
  // The same along several mesh dims: row-major over `mesh_dims` (the first listed varies slowest),
  // the other coordinates `process_id`'s (`process_id` alone when `mesh_dims` is empty).
  std::vector<int64_t> processes_along(int64_t process_id, std::span<const int> mesh_dims) const;

  std::string to_string() const;  // "[2,3]" or "[dp=2,tp=3]"
  friend bool operator==(const ProcessMesh& a, const ProcessMesh& b) {
    return a.shape_ == b.shape_ && a.process_ids_ == b.process_ids_ && a.dim_names_ == b.dim_names_;
  }

 private:
  Shape shape_;
  std::vector<int64_t> process_ids_;
  std::vector<std::string> dim_names_;
};

// Parses "2,3", "2x3", "[2,3]" or "dp=2,tp=3".
ProcessMesh parse_mesh(std::string_view text);

}  // namespace shardwise::mesh
