#pragma once
// Private to the indexing rules (index.cc, embedding.cc): small inline helpers and the rules
// defined in embedding.cc.
#include <array>
#include <cstdint>
#include <string_view>

#include "shardwise/spmd/einsum.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops::index_detail {
using namespace spmd;

// The labels of one tensor, stored inline (rules must not allocate).
struct Notation {
  std::array<char, kMaxDims> chars{};
  int size = 0;
  void push(char c) { chars[static_cast<size_t>(size++)] = c; }
  std::string_view view() const { return {chars.data(), static_cast<size_t>(size)}; }
  bool has(char c) const { return view().find(c) != std::string_view::npos; }
};

inline char letter(int dim) { return static_cast<char>('a' + dim); }

// For a tensor whose VALUES the kernel does not read (only its shape): keeps the given Partial
// placements wherever the required distribution is Replicate, so that no reshard is asked for.
inline void keep_unread_partials(DistAttr& required, const DistAttr& given) {
  for (int m = 0; m < required.mesh_ndim(); ++m) {
    if (required[m].is_replicate() && given[m].is_partial()) required.set(m, given[m]);
  }
}

// Sets Partial(sum) on the mesh dims sharding any letter of `notation` that `keep` does not hold.
inline void partial_for_missing(DistAttr& dist, std::string_view notation, const Notation& keep, const AxisMap& axes) {
  for (char c : notation) {
    if (c == '1' || keep.has(c)) continue;
    for (int m : axes[c]) dist.set(m, Placement::partial(ReduceOp::Sum));
  }
}

Rule embedding_rule();
Rule index_put_rule();

}  // namespace shardwise::ops::index_detail

namespace shardwise::ops {

// The SPMD rules of the index family (rules.cc), one member per rule; the family's ops take theirs
// from here when they register (ops.cc).
struct IndexRules {
  spmd::Rule index_select, gather, scatter_add, embedding, index_put;
};
IndexRules index_rules();

}  // namespace shardwise::ops
