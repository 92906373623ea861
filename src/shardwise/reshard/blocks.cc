#include "shardwise/reshard/blocks.h"

#include <algorithm>
#include <map>

#include "shardwise/core/error.h"

namespace shardwise::reshard {

Box box_of(const mesh::LocalBlock& block) {
  Box b;
  b.shape = block.shape;
  b.offset = block.offset;
  return b;
}

Box block_at(const Shape& global, const Layout& layout, std::span<const int64_t> coords) {
  return box_of(mesh::local_block(global, layout.dist, layout.mesh, coords));
}

Box intersect(const Box& a, const Box& b) {
  Box out;
  out.shape = a.shape;
  for (int d = 0; d < a.shape.ndim(); ++d) {
    auto i = static_cast<size_t>(d);
    int64_t lo = std::max(a.offset[i], b.offset[i]);
    int64_t hi = std::min(a.offset[i] + a.shape[d], b.offset[i] + b.shape[d]);
    out.offset[i] = lo;
    out.shape[d] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

namespace {

bool same_box(const Box& a, const Box& b) {
  if (!(a.shape == b.shape)) return false;
  for (int d = 0; d < a.shape.ndim(); ++d) {
    if (a.offset[static_cast<size_t>(d)] != b.offset[static_cast<size_t>(d)]) return false;
  }
  return true;
}

}  // namespace

std::vector<Transfer> plan_transfers(std::span<const Holder> sources, std::span<const Holder> destinations) {
  // Group sources into replica classes of identical boxes, in first-appearance order.
  std::vector<std::vector<const Holder*>> classes;
  for (const Holder& s : sources) {
    if (s.box.numel() == 0) continue;
    auto it = std::find_if(classes.begin(), classes.end(), [&](auto& c) { return same_box(c.front()->box, s.box); });
    if (it == classes.end()) classes.push_back({&s});
    else it->push_back(&s);
  }
  std::vector<Transfer> out;
  for (size_t di = 0; di < destinations.size(); ++di) {
    const Holder& d = destinations[di];
    if (d.box.numel() == 0) continue;
    for (const auto& replicas : classes) {
      Box inter = intersect(replicas.front()->box, d.box);
      if (inter.numel() == 0) continue;
      const Holder* from = replicas[di % replicas.size()];
      for (const Holder* r : replicas) {
        if (r->process == d.process) from = r;
      }
      out.push_back({from->process, d.process, inter});
    }
  }
  return out;
}

std::vector<Holder> holders(const Shape& global, const Layout& layout, std::span<const int64_t> coords,
                            std::span<const int> group_dims) {
  std::vector<Holder> out;
  int64_t count = 1;
  for (int m : group_dims) count *= layout.mesh.dim_size(m);
  std::vector<int64_t> c(coords.begin(), coords.end());
  for (int64_t i = 0; i < count; ++i) {
    // Group rank i: the listed dims vary, the first listed most significant (as MeshComm::along).
    int64_t rest = i;
    for (size_t j = group_dims.size(); j-- > 0;) {
      int m = group_dims[j];
      c[static_cast<size_t>(m)] = rest % layout.mesh.dim_size(m);
      rest /= layout.mesh.dim_size(m);
    }
    out.push_back({layout.mesh.process_ids()[static_cast<size_t>(layout.mesh.rank_index(c))], block_at(global, layout, c)});
  }
  return out;
}

int64_t max_local_numel(const Shape& global, const Layout& layout) {
  std::vector<int64_t> zeros(static_cast<size_t>(layout.mesh.ndim()), 0);
  return block_at(global, layout, zeros).numel();
}

}  // namespace shardwise::reshard
