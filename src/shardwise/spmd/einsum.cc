#include "shardwise/spmd/einsum.h"

#include "shardwise/core/error.h"

namespace shardwise::spmd {

size_t AxisMap::index(char letter) {
  SW_CHECK(letter >= 'a' && letter <= 'z', "axis label '{}' is not a letter a..z", letter);
  return static_cast<size_t>(letter - 'a');
}

char AxisMap::letter_of(int mesh_dim) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].contains(mesh_dim)) return static_cast<char>('a' + i);
  }
  return 0;
}

uint32_t AxisMap::claimed_mesh_dims() const {
  uint32_t mask = 0;
  for (const MeshDimList& dims : axes_) {
    for (int m : dims) mask |= 1u << m;
  }
  return mask;
}

AxisMap merge_axes(std::span<const std::string_view> notations, std::span<const DistAttr> dists,
                   std::string_view replicated) {
  std::array<const DistAttr*, 32> ptrs{};
  SW_CHECK(dists.size() <= ptrs.size(), "merge_axes: {} tensors (at most {})", dists.size(), ptrs.size());
  for (size_t t = 0; t < dists.size(); ++t) ptrs[t] = &dists[t];
  return merge_axes(notations, std::span<const DistAttr* const>(ptrs.data(), dists.size()), replicated);
}

AxisMap merge_axes(std::span<const std::string_view> notations, std::span<const DistAttr* const> dists,
                   std::string_view replicated) {
  SW_CHECK(notations.size() == dists.size(), "merge_axes: {} notations for {} tensors", notations.size(),
           dists.size());
  AxisMap axes;
  std::array<bool, 26> decided{};
  std::array<bool, kMaxDims * 4> mesh_used{};
  for (size_t t = 0; t < notations.size(); ++t) {
    std::string_view nota = notations[t];
    for (size_t d = 0; d < nota.size(); ++d) {
      char letter = nota[d];
      if (letter == '1' || replicated.find(letter) != std::string_view::npos) continue;
      MeshDimList dims = dists[t]->mesh_dims_of(static_cast<int>(d));
      if (dims.empty() || decided[static_cast<size_t>(letter - 'a')]) continue;
      decided[static_cast<size_t>(letter - 'a')] = true;
      MeshDimList& out = axes[letter];
      for (int m : dims) {
        if (mesh_used[static_cast<size_t>(m)]) continue;
        mesh_used[static_cast<size_t>(m)] = true;
        out.push_back(m);
      }
    }
  }
  return axes;
}

DistAttr dist_from_axes(std::string_view notation, const AxisMap& axes, int mesh_ndim) {
  DistAttr dist(mesh_ndim);
  for (size_t d = 0; d < notation.size(); ++d) {
    char letter = notation[d];
    if (letter == '1') continue;
    const MeshDimList& dims = axes[letter];
    if (!dims.empty()) dist.set_shard_order(static_cast<int>(d), dims);
  }
  return dist;
}

void add_partial_for(DistAttr& dist, std::string_view letters, const AxisMap& axes, ReduceOp op) {
  for (char letter : letters) {
    for (int m : axes[letter]) dist.set(m, Placement::partial(op));
  }
}

std::string_view axis_letters(int n) {
  static constexpr std::string_view kLetters = "abcdefghijklmnopqrstuvwxyz";
  SW_CHECK(n >= 0 && n <= 26, "cannot label {} dims with letters", n);
  return kLetters.substr(0, static_cast<size_t>(n));
}

}  // namespace shardwise::spmd
