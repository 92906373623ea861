#pragma once
// Which block of a global tensor a rank holds.
//
// Uneven dims use `chunk` semantics: a dim of n elements split over k ranks gives every rank
// ceil(n / k) elements except at the end, where shards are shorter and trailing shards may be
// empty (n = 5, k = 4 -> 2, 2, 1, 0). A dim split over several mesh dims is split in the
// distribution's shard order, each split cutting the previous one's chunk.
#include <array>
#include <cstdint>
#include <span>

#include "shardwise/core/shape.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"

namespace shardwise::mesh {

struct Range {
  int64_t offset = 0;
  int64_t size = 0;
};

// Part `index` of `n` elements split into `parts` chunks.
Range chunk_range(int64_t n, int64_t parts, int64_t index);

struct LocalBlock {
  Shape shape;                                // local shape
  std::array<int64_t, kMaxDims> offset{};     // global offset of the local block
  std::span<const int64_t> offsets() const { return {offset.data(), static_cast<size_t>(shape.ndim())}; }
};

// The block of a tensor of `global` shape held by the rank at `coords` under `dist`.
LocalBlock local_block(const Shape& global, const DistAttr& dist, const ProcessMesh& mesh,
                       std::span<const int64_t> coords);
Shape local_shape(const Shape& global, const DistAttr& dist, const ProcessMesh& mesh,
                  std::span<const int64_t> coords);

}  // namespace shardwise::mesh
