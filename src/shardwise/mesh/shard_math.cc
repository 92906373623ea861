#include "shardwise/mesh/shard_math.h"

#include <algorithm>

#include "shardwise/core/error.h"

namespace shardwise::mesh {

Range chunk_range(int64_t n, int64_t parts, int64_t index) {
  SW_CHECK(parts >= 1 && index >= 0 && index < parts, "chunk {} of {} parts is out of range", index, parts);
  int64_t size = (n + parts - 1) / parts;
  int64_t begin = std::min(index * size, n);
  int64_t end = std::min(begin + size, n);
  return {begin, end - begin};
}

LocalBlock local_block(const Shape& global, const DistAttr& dist, const ProcessMesh& mesh,
                       std::span<const int64_t> coords) {
  dist.validate(global.ndim(), mesh.ndim());
  SW_CHECK(static_cast<int>(coords.size()) == mesh.ndim(), "mesh {} needs {} coordinates, got {}",
           mesh.to_string(), mesh.ndim(), coords.size());
  LocalBlock block;
  block.shape = global;
  for (int d = 0; d < global.ndim(); ++d) {
    MeshDimList dims = dist.mesh_dims_of(d);
    Range r{0, global[d]};
    for (int m : dims) {
      Range c = chunk_range(r.size, mesh.dim_size(m), coords[static_cast<size_t>(m)]);
      r = {r.offset + c.offset, c.size};
    }
    block.shape[d] = r.size;
    block.offset[static_cast<size_t>(d)] = r.offset;
  }
  return block;
}

Shape local_shape(const Shape& global, const DistAttr& dist, const ProcessMesh& mesh,
                  std::span<const int64_t> coords) {
  return local_block(global, dist, mesh, coords).shape;
}

}  // namespace shardwise::mesh
