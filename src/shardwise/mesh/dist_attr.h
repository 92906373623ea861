#pragma once
// The distribution of one tensor over a mesh: one Placement per mesh dim.
//
// Co-sharding: a tensor dim may be sharded over several mesh dims. The order in which those
// mesh dims split it matters when shards are uneven; by default it is increasing mesh-dim order
// (mesh dim 0 cuts the tensor dim into chunks, then mesh dim 1 cuts each chunk, ...), the same
// nesting as PyTorch DTensor. A different order can be set with set_shard_order() and is printed
// as "S(0)@k" (k = position in the order) when it differs from the default.
//
// A value that is Partial on several mesh dims is reduced over the last such mesh dim first,
// then over the earlier ones: global = reduce_{first}( ... reduce_{last}(local) ).
#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/mesh/placement.h"

namespace shardwise::mesh {

inline constexpr int kMaxMeshDims = 8;

// A short list of mesh dims (the ordered mesh dims that shard one tensor dim).
struct MeshDimList {
  std::array<int8_t, kMaxMeshDims> dims{};
  int8_t count = 0;
  void push_back(int d) { dims[static_cast<size_t>(count++)] = static_cast<int8_t>(d); }
  int size() const { return count; }
  bool empty() const { return count == 0; }
  int operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  const int8_t* begin() const { return dims.data(); }
  const int8_t* end() const { return dims.data() + count; }
  bool contains(int d) const;
  friend bool operator==(const MeshDimList& a, const MeshDimList& b) {
    if (a.count != b.count) return false;
    for (int i = 0; i < a.count; ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }
};

class DistAttr {
 public:
  DistAttr() = default;
  explicit DistAttr(int mesh_ndim);  // all Replicate
  DistAttr(std::initializer_list<Placement> placements);
  explicit DistAttr(std::span<const Placement> placements);

  int mesh_ndim() const { return ndim_; }
  const Placement& operator[](int mesh_dim) const { return placements_[static_cast<size_t>(mesh_dim)]; }
  std::span<const Placement> placements() const { return {placements_.data(), static_cast<size_t>(ndim_)}; }
  // Sets one mesh dim's placement. A mesh dim newly sharding a tensor dim goes after the mesh dims
  // already sharding it when a custom order is set, else takes its mesh-dim position.
  void set(int mesh_dim, Placement placement);
  // Sets the order in which `mesh_dims` split `tensor_dim`; they become exactly the mesh dims
  // sharding it (their previous placements are replaced by Shard(tensor_dim)).
  void set_shard_order(int tensor_dim, std::span<const int8_t> mesh_dims);
  void set_shard_order(int tensor_dim, const MeshDimList& mesh_dims) {
    set_shard_order(tensor_dim, std::span<const int8_t>(mesh_dims.begin(), mesh_dims.end()));
  }

  // Mesh dims sharding `tensor_dim`, in split order.
  MeshDimList mesh_dims_of(int tensor_dim) const;
  bool is_sharded(int tensor_dim) const;
  bool is_replicated() const;  // Replicate on every mesh dim
  bool has_partial() const;
  bool has_default_order() const;
  std::vector<int> partial_dims() const;
  DistAttr without_partials() const;  // every Partial mesh dim made Replicate

  // Error unless every Shard names a dim of a tensor of rank `tensor_ndim` and the mesh has
  // `mesh_ndim` dims; `what` names the tensor in the message.
  void validate(int tensor_ndim, int mesh_ndim, std::string_view what = "tensor") const;
  bool is_valid(int tensor_ndim, int mesh_ndim) const;

  // PaddlePaddle's view: dims_mapping[tensor dim] = mesh dim sharding it or -1, plus the partial
  // status {mesh dim: reduce op}. A co-sharded dim cannot be expressed: Error.
  std::vector<int64_t> dims_mapping(int tensor_ndim) const;
  std::map<int, ReduceOp> partial_status() const;
  static DistAttr from_dims_mapping(int mesh_ndim, std::span<const int64_t> dims_mapping,
                                    const std::map<int, ReduceOp>& partial_status = {});

  std::string to_string() const;  // "S(0),R" ; "S(0)@1,S(0)@0" for a non-default co-shard order
  friend bool operator==(const DistAttr& a, const DistAttr& b);

 private:
  void normalize_orders();
  std::array<Placement, kMaxMeshDims> placements_{};
  // For Shard mesh dims: a key ordering the mesh dims within their tensor dim's group. After
  // normalization the keys of a group are exactly the mesh dims of the group, permuted.
  std::array<int8_t, kMaxMeshDims> order_{};
  int8_t ndim_ = 0;
};

// Parses "S(0),R" (placements per mesh dim, "@k" for a co-shard order). mesh_ndim is checked
// when >= 0.
DistAttr parse_dist(std::string_view text, int mesh_ndim = -1);

}  // namespace shardwise::mesh
