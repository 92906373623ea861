#include "shardwise/mesh/dist_attr.h"

#include <algorithm>
#include <charconv>

#include "shardwise/core/error.h"

namespace shardwise::mesh {

bool MeshDimList::contains(int d) const {
  return std::find(begin(), end(), static_cast<int8_t>(d)) != end();
}

DistAttr::DistAttr(int mesh_ndim) : ndim_(static_cast<int8_t>(mesh_ndim)) {
  SW_CHECK(mesh_ndim >= 0 && mesh_ndim <= kMaxMeshDims, "mesh of {} dims: at most {} are supported",
           mesh_ndim, kMaxMeshDims);
  for (int m = 0; m < kMaxMeshDims; ++m) order_[static_cast<size_t>(m)] = static_cast<int8_t>(m);
}

DistAttr::DistAttr(std::initializer_list<Placement> placements)
    : DistAttr(std::span<const Placement>(placements.begin(), placements.size())) {}

DistAttr::DistAttr(std::span<const Placement> placements) : DistAttr(static_cast<int>(placements.size())) {
  for (size_t m = 0; m < placements.size(); ++m) placements_[m] = placements[m];
}

DistAttr DistAttr::without_partials() const {
  DistAttr out = *this;
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_partial()) out.set(m, Placement::replicate());
  }
  return out;
}

void DistAttr::set(int mesh_dim, Placement placement) {
  SW_CHECK(mesh_dim >= 0 && mesh_dim < ndim_, "mesh dim {} does not exist: the distribution has {} mesh dims",
           mesh_dim, ndim_);
  auto m = static_cast<size_t>(mesh_dim);
  bool joins = placement.is_shard() && !(placements_[m] == placement);
  const bool leaves = placements_[m].is_shard() && !(placements_[m] == placement);
  placements_[m] = placement;
  order_[m] = static_cast<int8_t>(mesh_dim);
  // Replicate or Partial where no shard was: no co-shard group changes (the common case in rules).
  if (!joins && !leaves && !placement.is_shard()) return;
  if (joins && !has_default_order()) {
    // Keep a custom order custom: the newcomer splits last.
    int8_t key = static_cast<int8_t>(mesh_dim);
    for (int o = 0; o < ndim_; ++o) {
      if (o != mesh_dim && placements_[static_cast<size_t>(o)] == placement) key = std::max<int8_t>(key, order_[static_cast<size_t>(o)] + 1);
    }
    order_[m] = key;
  }
  normalize_orders();
}

void DistAttr::set_shard_order(int tensor_dim, std::span<const int8_t> mesh_dims) {
  // Clear the old members of the group, then add the new ones with increasing keys.
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_shard(tensor_dim)) {
      placements_[static_cast<size_t>(m)] = Placement::replicate();
      order_[static_cast<size_t>(m)] = static_cast<int8_t>(m);
    }
  }
  int8_t key = 0, previous = -1;
  bool ascending = true, displaced = false;
  for (int8_t m : mesh_dims) {
    SW_CHECK(m >= 0 && m < ndim_, "mesh dim {} does not exist: the distribution has {} mesh dims", m, ndim_);
    SW_CHECK(!placements_[static_cast<size_t>(m)].is_shard(tensor_dim), "mesh dim {} listed twice for tensor dim {}", m, tensor_dim);
    displaced = displaced || placements_[static_cast<size_t>(m)].is_shard();  // taken from another group
    placements_[static_cast<size_t>(m)] = Placement::shard(tensor_dim);
    order_[static_cast<size_t>(m)] = key++;
    ascending = ascending && m > previous;
    previous = m;
  }
  if (ascending && !displaced) {
    // The default order, and no other group changed: the normalized keys are the members' own dims.
    for (int8_t m : mesh_dims) order_[static_cast<size_t>(m)] = m;
    return;
  }
  normalize_orders();
}

void DistAttr::normalize_orders() {
  // Within each group, sort members by (key, mesh dim) and reassign keys = sorted member dims.
  std::array<bool, kMaxMeshDims> done{};
  for (int m = 0; m < ndim_; ++m) {
    const Placement& p = placements_[static_cast<size_t>(m)];
    if (!p.is_shard()) {
      order_[static_cast<size_t>(m)] = static_cast<int8_t>(m);
      continue;
    }
    if (done[static_cast<size_t>(m)]) continue;
    std::array<int8_t, kMaxMeshDims> members{};
    int n = 0;
    for (int o = m; o < ndim_; ++o) {
      if (placements_[static_cast<size_t>(o)].is_shard(p.dim)) {
        members[static_cast<size_t>(n++)] = static_cast<int8_t>(o);
        done[static_cast<size_t>(o)] = true;
      }
    }
    std::array<int8_t, kMaxMeshDims> by_key = members;
    std::sort(by_key.begin(), by_key.begin() + n, [&](int8_t a, int8_t b) {
      auto ka = order_[static_cast<size_t>(a)], kb = order_[static_cast<size_t>(b)];
      return ka != kb ? ka < kb : a < b;
    });
    // members is sorted by mesh dim; the i-th in split order gets key members[i].
    for (int i = 0; i < n; ++i) order_[static_cast<size_t>(by_key[static_cast<size_t>(i)])] = members[static_cast<size_t>(i)];
  }
}

MeshDimList DistAttr::mesh_dims_of(int tensor_dim) const {
  MeshDimList out;
  // Keys of a group are its mesh dims permuted: visiting keys in increasing order gives the split order.
  std::array<int8_t, kMaxMeshDims> by_key{};
  int n = 0;
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_shard(tensor_dim)) by_key[static_cast<size_t>(n++)] = static_cast<int8_t>(m);
  }
  std::sort(by_key.begin(), by_key.begin() + n,
            [&](int8_t a, int8_t b) { return order_[static_cast<size_t>(a)] < order_[static_cast<size_t>(b)]; });
  for (int i = 0; i < n; ++i) out.push_back(by_key[static_cast<size_t>(i)]);
  return out;
}

bool DistAttr::is_sharded(int tensor_dim) const {
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_shard(tensor_dim)) return true;
  }
  return false;
}

bool DistAttr::is_replicated() const {
  for (int m = 0; m < ndim_; ++m) {
    if (!placements_[static_cast<size_t>(m)].is_replicate()) return false;
  }
  return true;
}

bool DistAttr::has_partial() const {
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_partial()) return true;
  }
  return false;
}

bool DistAttr::has_default_order() const {
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_shard() && order_[static_cast<size_t>(m)] != m) return false;
  }
  return true;
}

std::vector<int> DistAttr::partial_dims() const {
  std::vector<int> out;
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_partial()) out.push_back(m);
  }
  return out;
}

void DistAttr::validate(int tensor_ndim, int mesh_ndim, std::string_view what) const {
  SW_CHECK(ndim_ == mesh_ndim, "{} has {} placements ({}) but the mesh has {} dims", what, ndim_,
           to_string(), mesh_ndim);
  for (int m = 0; m < ndim_; ++m) {
    const Placement& p = placements_[static_cast<size_t>(m)];
    SW_CHECK(!p.is_shard() || (p.dim >= 0 && p.dim < tensor_ndim),
             "{}: placement {} on mesh dim {} names tensor dim {}, but the tensor has rank {}", what,
             p.to_string(), m, p.dim, tensor_ndim);
  }
}

bool DistAttr::is_valid(int tensor_ndim, int mesh_ndim) const {
  if (ndim_ != mesh_ndim) return false;
  for (int m = 0; m < ndim_; ++m) {
    const Placement& p = placements_[static_cast<size_t>(m)];
    if (p.is_shard() && (p.dim < 0 || p.dim >= tensor_ndim)) return false;
  }
  return true;
}

std::vector<int64_t> DistAttr::dims_mapping(int tensor_ndim) const {
  std::vector<int64_t> out(static_cast<size_t>(tensor_ndim), -1);
  for (int d = 0; d < tensor_ndim; ++d) {
    MeshDimList dims = mesh_dims_of(d);
    SW_CHECK(dims.size() <= 1, "tensor dim {} is sharded over {} mesh dims ({}); a dims_mapping can name only one",
             d, dims.size(), to_string());
    if (dims.size() == 1) out[static_cast<size_t>(d)] = dims[0];
  }
  return out;
}

std::map<int, ReduceOp> DistAttr::partial_status() const {
  std::map<int, ReduceOp> out;
  for (int m = 0; m < ndim_; ++m) {
    if (placements_[static_cast<size_t>(m)].is_partial()) out[m] = placements_[static_cast<size_t>(m)].reduce;
  }
  return out;
}

DistAttr DistAttr::from_dims_mapping(int mesh_ndim, std::span<const int64_t> dims_mapping,
                                     const std::map<int, ReduceOp>& partial_status) {
  DistAttr d(mesh_ndim);
  for (size_t t = 0; t < dims_mapping.size(); ++t) {
    int64_t m = dims_mapping[t];
    if (m == -1) continue;
    SW_CHECK(m >= 0 && m < mesh_ndim, "dims_mapping[{}] = {} is not a mesh dim of a {}-d mesh (or -1)", t, m,
             mesh_ndim);
    SW_CHECK(d[static_cast<int>(m)].is_replicate(), "dims_mapping maps mesh dim {} to two tensor dims", m);
    d.placements_[static_cast<size_t>(m)] = Placement::shard(static_cast<int>(t));
  }
  for (auto [m, op] : partial_status) {
    SW_CHECK(m >= 0 && m < mesh_ndim, "partial status names mesh dim {} of a {}-d mesh", m, mesh_ndim);
    SW_CHECK(d[m].is_replicate(), "mesh dim {} is both sharding a tensor dim and partial", m);
    d.placements_[static_cast<size_t>(m)] = Placement::partial(op);
  }
  d.normalize_orders();
  return d;
}

std::string DistAttr::to_string() const {
  std::string out;
  bool custom = !has_default_order();
  for (int m = 0; m < ndim_; ++m) {
    if (m) out += ',';
    const Placement& p = placements_[static_cast<size_t>(m)];
    out += p.to_string();
    if (custom && p.is_shard()) {
      MeshDimList dims = mesh_dims_of(p.dim);
      if (dims.size() > 1) {
        int pos = static_cast<int>(std::find(dims.begin(), dims.end(), m) - dims.begin());
        out += "@" + std::to_string(pos);
      }
    }
  }
  return out;
}

bool operator==(const DistAttr& a, const DistAttr& b) {
  if (a.ndim_ != b.ndim_) return false;
  for (int m = 0; m < a.ndim_; ++m) {
    if (!(a[m] == b[m])) return false;
    if (a[m].is_shard() && a.order_[static_cast<size_t>(m)] != b.order_[static_cast<size_t>(m)]) return false;
  }
  return true;
}

DistAttr parse_dist(std::string_view text, int mesh_ndim) {
  std::vector<Placement> placements;
  std::vector<int> positions;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(pos, end - pos);
    int position = -1;
    size_t at = part.find('@');
    if (at != std::string_view::npos) {
      std::string_view num = part.substr(at + 1);
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), position);
      SW_CHECK(ec == std::errc() && p == num.data() + num.size() && position >= 0,
               "cannot read '{}': the split position after '@' must be a non-negative integer", part);
      part = part.substr(0, at);
    }
    placements.push_back(parse_placement(part));
    SW_CHECK(position < 0 || placements.back().is_shard(), "'{}': only a Shard placement takes '@order'", part);
    positions.push_back(position);
    pos = end + 1;
  }
  SW_CHECK(mesh_ndim < 0 || static_cast<int>(placements.size()) == mesh_ndim,
           "placements '{}' name {} mesh dims but the mesh has {}", text, placements.size(), mesh_ndim);
  DistAttr d{std::span<const Placement>(placements)};
  // Apply explicit orders group by group.
  for (size_t m = 0; m < placements.size(); ++m) {
    if (positions[m] < 0) continue;
    int dim = placements[m].dim;
    std::vector<std::pair<int, int8_t>> group;
    for (size_t o = 0; o < placements.size(); ++o) {
      if (placements[o].is_shard(dim)) {
        SW_CHECK(positions[o] >= 0, "'{}': give '@order' to every mesh dim sharding tensor dim {} or to none", text, dim);
        group.emplace_back(positions[o], static_cast<int8_t>(o));
      }
    }
    std::sort(group.begin(), group.end());
    std::vector<int8_t> order;
    for (size_t i = 0; i < group.size(); ++i) {
      SW_CHECK(group[i].first == static_cast<int>(i), "'{}': the '@' positions of tensor dim {} must be 0..{}",
               text, dim, group.size() - 1);
      order.push_back(group[i].second);
    }
    d.set_shard_order(dim, std::span<const int8_t>(order));
  }
  return d;
}

}  // namespace shardwise::mesh
