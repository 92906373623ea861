#pragma once
// Einsum-style sharding inference, the common core of most rules.
//
// Each tensor's dims are labelled with letters ('a'..'z'); the same letter on two tensors is the
// same logical axis. A label '1' marks a dim that takes no part (a broadcast size-1 dim): it is
// never sharded.
//
// merge_axes() decides, for every letter, the ordered mesh dims that shard it:
//  1. tensors are visited in argument order, and within a tensor its dims from first to last;
//  2. a letter takes the mesh dims of the FIRST tensor that shards it; a later tensor sharding
//     the same letter differently loses and will be resharded;
//  3. a mesh dim shards at most one letter: the first letter to claim it (in the visiting order
//     above) keeps it, later claims are dropped (that tensor dim is resharded along that mesh dim);
//  4. letters listed in `replicated` are never sharded.
// Partial placements are not merged here: each rule decides what Partial inputs need.
#include <array>
#include <span>
#include <string_view>

#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {

class AxisMap {
 public:
  MeshDimList& operator[](char letter) { return axes_[index(letter)]; }
  const MeshDimList& operator[](char letter) const { return axes_[index(letter)]; }
  // The letter a mesh dim shards, or 0.
  char letter_of(int mesh_dim) const;
  // Bit m set when mesh dim m shards any letter.
  uint32_t claimed_mesh_dims() const;

 private:
  static size_t index(char letter);
  std::array<MeshDimList, 26> axes_{};
};

AxisMap merge_axes(std::span<const std::string_view> notations, std::span<const DistAttr> dists,
                   std::string_view replicated = "");
// The same over distributions held elsewhere (no copies).
AxisMap merge_axes(std::span<const std::string_view> notations, std::span<const DistAttr* const> dists,
                   std::string_view replicated = "");
inline AxisMap merge_axes(std::initializer_list<std::string_view> notations,
                          std::initializer_list<DistAttr> dists, std::string_view replicated = "") {
  return merge_axes(std::span<const std::string_view>(notations.begin(), notations.size()),
                    std::span<const DistAttr>(dists.begin(), dists.size()), replicated);
}

// The distribution of a tensor labelled `notation` under `axes` (Shard or Replicate only).
DistAttr dist_from_axes(std::string_view notation, const AxisMap& axes, int mesh_ndim);

// Sets Partial(op) on the mesh dims that shard any letter in `letters` (e.g. a contracted axis).
void add_partial_for(DistAttr& dist, std::string_view letters, const AxisMap& axes, ReduceOp op);

// The first `n` letters for a tensor of rank n: "abc..." (n <= 26).
std::string_view axis_letters(int n);

}  // namespace shardwise::spmd
