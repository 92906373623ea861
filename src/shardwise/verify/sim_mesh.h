#pragma once
// A simulated mesh: global tensors cut into the shards each rank holds, and shards put back
// together. Used by the verifier (and by tests of anything that moves shards).
#include <string>
#include <vector>

#include "shardwise/core/philox.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/ops/op.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::verify {

// Random values for a tensor, drawn element by element from `rng` (element i uses index i).
Tensor random_tensor(const Shape& shape, DType dtype, const ops::ValueGen& gen, const Philox& rng);

// The local tensor of every rank (indexed by rank index in the mesh) for `global` under `dist`.
// Partial mesh dims split the value into unequal random parts that reduce to it: sum parts add
// up to it, avg parts average to it, max (min) parts are all <= (>=) it and one rank holds it.
std::vector<Tensor> distribute(const Tensor& global, const mesh::DistAttr& dist, const mesh::ProcessMesh& mesh,
                               const Philox& rng);

// Rebuilds the global tensor from every rank's local tensor under `dist`: checks each local
// shape, reduces Partial mesh dims (the last one first), checks that replicas agree bit for bit,
// and pastes shards. On a problem returns an undefined tensor and sets `error`.
Tensor assemble(const std::vector<Tensor>& locals, const Shape& global_shape, DType dtype,
                const mesh::DistAttr& dist, const mesh::ProcessMesh& mesh, std::string& error);

}  // namespace shardwise::verify
