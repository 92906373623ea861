#pragma once
// Blocks of a distributed tensor and the transfers that move one layout's blocks into another's.
#include <array>
#include <vector>

#include "shardwise/core/shape.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/reshard/plan.h"

namespace shardwise::reshard {

// A box of a global tensor: [offset, offset + shape).
struct Box {
  std::array<int64_t, kMaxDims> offset{};
  Shape shape;
  int64_t numel() const { return shape.numel(); }
};
Box box_of(const mesh::LocalBlock& block);
// The box held by the rank at `coords` of `layout.mesh` (Partial dims hold the whole extent).
Box block_at(const Shape& global, const Layout& layout, std::span<const int64_t> coords);
// Intersection of two boxes (shape may have zero extents).
Box intersect(const Box& a, const Box& b);

// One block moving from a source process to a destination process (process ids of the meshes).
struct Transfer {
  int64_t src = 0;
  int64_t dst = 0;
  Box box;  // global coordinates
};

// Who holds what: a process and its box.
struct Holder {
  int64_t process = 0;
  Box box;
};

// The transfers that give every destination its box from the sources. Sources holding identical
// boxes are replicas: a destination takes its data from itself when it is one of them, otherwise
// from replica number (destination index mod replica count), which spreads the load. Sources'
// distinct boxes must not overlap (true of any layout without Partial). Deterministic: every
// process computes the same list. Empty intersections are left out.
std::vector<Transfer> plan_transfers(std::span<const Holder> sources, std::span<const Holder> destinations);

// Holders of `layout` restricted to the ranks that differ from `coords` only in `group_dims`
// (all ranks of the mesh when group_dims lists every dim), in group-rank order.
std::vector<Holder> holders(const Shape& global, const Layout& layout, std::span<const int64_t> coords,
                            std::span<const int> group_dims);

// The largest number of elements any rank holds under `layout` (the first chunk is the largest).
int64_t max_local_numel(const Shape& global, const Layout& layout);

}  // namespace shardwise::reshard
