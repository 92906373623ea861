#include "shardwise/comm/communicator.h"

#include "shardwise/core/error.h"

namespace shardwise::comm {

Reduce to_reduce(mesh::ReduceOp op) {
  switch (op) {
    case mesh::ReduceOp::Sum: return Reduce::Sum;
    case mesh::ReduceOp::Avg: return Reduce::Avg;
    case mesh::ReduceOp::Max: return Reduce::Max;
    case mesh::ReduceOp::Min: return Reduce::Min;
  }
  return Reduce::Sum;
}

std::string_view reduce_name(Reduce op) {
  switch (op) {
    case Reduce::Sum: return "sum";
    case Reduce::Avg: return "avg";
    case Reduce::Max: return "max";
    case Reduce::Min: return "min";
    case Reduce::Prod: return "prod";
  }
  return "?";
}

void Communicator::all_reduce(const Tensor& in, Tensor& out, Reduce op) {
  SW_CHECK(in.dtype() == out.dtype() && in.shape() == out.shape(),
           "all_reduce: input {} {} and output {} {} differ", dtype_name(in.dtype()), in.shape().to_string(),
           dtype_name(out.dtype()), out.shape().to_string());
  all_reduce(in.raw(), out.raw(), in.numel(), in.dtype(), op);
}

MeshComm::MeshComm(mesh::ProcessMesh mesh, std::shared_ptr<Communicator> world)
    : mesh_(std::move(mesh)), world_(std::move(world)) {
  SW_CHECK(world_->size() == mesh_.size(), "mesh {} has {} ranks but the communicator has {}", mesh_.to_string(),
           mesh_.size(), world_->size());
  rank_index_ = world_->rank();
}

Communicator& MeshComm::along(std::span<const int> mesh_dims) {
  uint32_t key = 0;
  for (int m : mesh_dims) {
    SW_CHECK(m >= 0 && m < mesh_.ndim(), "mesh {} has no dim {}", mesh_.to_string(), m);
    key = key * 16 + static_cast<uint32_t>(m) + 1;
  }
  for (auto& [k, g] : groups_) {
    if (k == key) return *g;
  }
  // Members: vary the listed mesh dims (first listed = most significant), keep the others.
  std::vector<int64_t> coords = mesh_.coords(rank_index_);
  std::vector<int> members;
  int64_t count = 1;
  for (int m : mesh_dims) count *= mesh_.dim_size(m);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i;
    std::vector<int64_t> c = coords;
    for (size_t j = mesh_dims.size(); j-- > 0;) {
      int m = mesh_dims[j];
      c[static_cast<size_t>(m)] = rest % mesh_.dim_size(m);
      rest /= mesh_.dim_size(m);
    }
    members.push_back(world_->members()[static_cast<size_t>(mesh_.rank_index(c))]);
  }
  groups_.emplace_back(key, world_->group(members));
  return *groups_.back().second;
}

}  // namespace shardwise::comm
