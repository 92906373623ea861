#pragma once
// One interface for collectives, whatever carries them (threads of one process, MPI processes,
// NCCL on GPUs). Argument order is (input, output) everywhere; counts are in elements.
// A size or count mismatch between ranks is an Error naming both sizes, never a hang.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/core/dtype.h"
#include "shardwise/mesh/placement.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::comm {

// Reduction of a collective: the placements' four plus prod.
enum class Reduce : uint8_t { Sum, Avg, Max, Min, Prod };
Reduce to_reduce(mesh::ReduceOp op);
std::string_view reduce_name(Reduce op);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The global ranks of this group's members, in group-rank order.
  virtual const std::vector<int>& members() const = 0;

  // A communicator over `global_ranks` (a subset of this one's members, in the given order) for
  // a member of it; every member must call it (collective over the sub-group only).
  virtual std::shared_ptr<Communicator> group(std::span<const int> global_ranks) = 0;

  // out = reduce over ranks of in; in == out allowed. Every rank gets the same bits.
  virtual void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) = 0;
  // out (count * size elements) = concatenation of every rank's `count` elements, in rank order.
  virtual void all_gather(const void* in, void* out, int64_t count, DType dtype) = 0;
  // Root's buffer is copied to every rank's buffer.
  virtual void broadcast(void* buffer, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  // Tensor helpers (contiguous tensors; shapes must agree across ranks).
  void all_reduce(const Tensor& in, Tensor& out, Reduce op);
  void all_reduce(Tensor& inout, Reduce op) { all_reduce(inout, inout, op); }
};

// The communicators of one rank along mesh dims: for each subset of mesh dims, the group of
// ranks that differ from this rank only in those dims (e.g. the tp group of a dp x tp mesh).
class MeshComm {
 public:
  MeshComm(mesh::ProcessMesh mesh, std::shared_ptr<Communicator> world);
  const mesh::ProcessMesh& mesh() const { return mesh_; }
  int64_t rank_index() const { return rank_index_; }
  // The group along `mesh_dims` (in that order of mesh dims). Created on first use: every rank of
  // the group must ask for it in the same order.
  Communicator& along(std::span<const int> mesh_dims);
  Communicator& world() { return *world_; }

 private:
  mesh::ProcessMesh mesh_;
  std::shared_ptr<Communicator> world_;
  int64_t rank_index_ = 0;
  std::vector<std::pair<uint32_t, std::shared_ptr<Communicator>>> groups_;
};

}  // namespace shardwise::comm
