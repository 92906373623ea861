#pragma once
// Helpers shared by the shape-op rules (rules.cc, rules_reshape.cc, rules_join.cc). Private to them.
//
// Every shape op moves or copies elements without arithmetic, so every Partial (sum, avg, max,
// min) of an input passes through the forward op unchanged: each rank's part is moved the same
// way, and reducing moved parts = moving the reduced value. The joins (concat, stack, and split's
// gradient) combine several tensors, where a Partial passes only when it is exact for all of them.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "shardwise/spmd/einsum.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// The SPMD rules of the shape family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct ShapeRules {
  spmd::Rule reshape, squeeze, unsqueeze, flatten, transpose, concat, stack, split, expand, slice, tile;
};
ShapeRules shape_rules();

}  // namespace shardwise::ops

namespace shardwise::ops::shape_detail {
using namespace spmd;

// Where each dim of one tensor goes in another: to[d] = the dim that dim d becomes, or -1 when
// its sharding cannot be kept (it is made Replicate).
struct DimMap {
  std::array<int8_t, kMaxDims> to{};
  int n = 0;
  void set(int d, int target) {
    to[static_cast<size_t>(d)] = static_cast<int8_t>(target);
    if (d >= n) n = d + 1;
  }
};

// `src` with each dim d's mesh dims (in split order) moved to dim map.to[d] (dropped where -1);
// Partial placements copied.
DistAttr remap(const DistAttr& src, const DimMap& map);
// `src` with the dims that map to -1 made Replicate; the rest (and the Partials) as they are.
DistAttr keep_mapped(const DistAttr& src, const DimMap& map);
// `dist` with every Partial(max|min) mesh dim made Replicate (for gradients that sum).
DistAttr drop_max_min(DistAttr dist);

// The mesh dims of `dims` (in split order) under which a dim of extent `a` and the dim of
// extent `b` it becomes both split into equal chunks: kept greedily while a and b divide by the
// product of the kept mesh dims' sizes (both > 0).
MeshDimList keep_even(const MeshDimList& dims, int64_t a, int64_t b, const ProcessMesh& mesh);

// spmd::merge_axes over tensors that all carry `notation` (no allocation for up to 16 tensors).
AxisMap merge_same(std::span<const TensorSpec> tensors, std::string_view notation, std::string_view replicated);

// The Partial a join keeps on mesh dim m, given every joined tensor's placement there (a mesh dim
// that shards no merged dim): the first Partial in argument order, p. P(sum)/P(avg) only when
// every tensor is p (a Replicate operand would be counted once per rank); P(max)/P(min) always —
// the tensors that are p keep it and the others become Replicate (a replicated value reduces to
// itself under max/min). Otherwise Replicate.
Placement join_partial(std::span<const TensorSpec> tensors, int m);
// Applies join_partial on every mesh dim no letter of `axes` claims: sets it on `out` and on the
// tensors (required[i]) that carry it.
void join_partials(std::span<const TensorSpec> tensors, const AxisMap& axes, std::span<DistAttr> required,
                   DistAttr& out);

// Error unless tensors.size() >= 1 (variadic inputs), then validates them.
void check_variadic(std::string_view rule, const ProcessMesh& mesh, std::span<const TensorSpec> tensors);
// Error unless `spec` has shape `want` (`what` names it in the message).
void check_shape(std::string_view rule, const TensorSpec& spec, const Shape& want, std::string_view what);

// Rule registration, one function per file.
void add_reshape_rules(ShapeRules& r);  // reshape, squeeze, unsqueeze, flatten, transpose
void add_join_rules(ShapeRules& r);     // concat, stack, split
void add_copy_rules(ShapeRules& r);     // expand, slice, tile (rules.cc)

}  // namespace shardwise::ops::shape_detail
