#include "shardwise/mesh/process_mesh.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "shardwise/core/error.h"

namespace shardwise::mesh {

ProcessMesh::ProcessMesh(const Shape& shape, std::vector<int64_t> process_ids,
                         std::vector<std::string> dim_names)
    : shape_(shape), process_ids_(std::move(process_ids)), dim_names_(std::move(dim_names)) {
  SW_CHECK(shape_.ndim() >= 1, "a process mesh needs at least one dim");
  for (int d = 0; d < shape_.ndim(); ++d) {
    SW_CHECK(shape_[d] >= 1, "mesh dim {} has size {}; every mesh dim needs at least one process", d,
             shape_[d]);
  }
  int64_t n = shape_.numel();
  if (process_ids_.empty()) {
    for (int64_t i = 0; i < n; ++i) process_ids_.push_back(i);
  }
  SW_CHECK(static_cast<int64_t>(process_ids_.size()) == n,
           "mesh {} holds {} processes but {} process ids were given", shape_.to_string(), n,
           process_ids_.size());
  std::set<int64_t> seen(process_ids_.begin(), process_ids_.end());
  SW_CHECK(seen.size() == process_ids_.size(), "mesh process ids must be distinct, got [{}]",
           fmt::join(process_ids_, ","));
  if (dim_names_.empty()) dim_names_.assign(static_cast<size_t>(shape_.ndim()), "");
  SW_CHECK(static_cast<int>(dim_names_.size()) == shape_.ndim(),
           "mesh of {} dims got {} dim names", shape_.ndim(), dim_names_.size());
  for (size_t i = 0; i < dim_names_.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      SW_CHECK(dim_names_[i].empty() || dim_names_[i] != dim_names_[j], "mesh dim name '{}' is used twice",
               dim_names_[i]);
    }
  }
}

int64_t ProcessMesh::dim_size(int mesh_dim) const {
  SW_CHECK(mesh_dim >= 0 && mesh_dim < ndim(), "mesh dim {} does not exist: mesh {} has {} dims",
           mesh_dim, to_string(), ndim());
  return shape_[mesh_dim];
}

int ProcessMesh::dim_index(std::string_view name) const {
  for (int d = 0; d < ndim(); ++d) {
    if (!dim_names_[static_cast<size_t>(d)].empty() && dim_names_[static_cast<size_t>(d)] == name) return d;
  }
  int value = -1;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), value);
  if (ec == std::errc() && p == name.data() + name.size() && value >= 0 && value < ndim()) return value;
  fail("mesh {} has no dim '{}' (dims are 0..{}{})", to_string(), name, ndim() - 1,
       std::any_of(dim_names_.begin(), dim_names_.end(), [](auto& s) { return !s.empty(); })
           ? fmt::format(", named {}", fmt::join(dim_names_, ","))
           : std::string());
}

std::vector<int64_t> ProcessMesh::coords(int64_t rank_index) const {
  SW_CHECK(rank_index >= 0 && rank_index < size(), "rank index {} is outside mesh {} of {} processes",
           rank_index, to_string(), size());
  std::vector<int64_t> c(static_cast<size_t>(ndim()));
  for (int d = ndim() - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = rank_index % shape_[d];
    rank_index /= shape_[d];
  }
  return c;
}

int64_t ProcessMesh::rank_index(std::span<const int64_t> coords) const {
  SW_CHECK(static_cast<int>(coords.size()) == ndim(), "mesh {} needs {} coordinates, got {}", to_string(),
           ndim(), coords.size());
  int64_t r = 0;
  for (int d = 0; d < ndim(); ++d) {
    SW_CHECK(coords[d] >= 0 && coords[d] < shape_[d], "coordinate {} of mesh dim {} is outside [0, {})",
             coords[d], d, shape_[d]);
    r = r * shape_[d] + coords[d];
  }
  return r;
}

int64_t ProcessMesh::rank_index_of_process(int64_t process_id) const {
  auto it = std::find(process_ids_.begin(), process_ids_.end(), process_id);
  SW_CHECK(it != process_ids_.end(), "process {} is not in mesh {} (processes [{}])", process_id,
           to_string(), fmt::join(process_ids_, ","));
  return it - process_ids_.begin();
}

std::vector<int64_t> ProcessMesh::processes_along(int64_t process_id, int mesh_dim) const {
  if (mesh_dim < 0) return {process_id};
  return processes_along(process_id, std::span<const int>(&mesh_dim, 1));
}

std::vector<int64_t> ProcessMesh::processes_along(int64_t process_id, std::span<const int> mesh_dims) const {
  const std::vector<int64_t> coords = this->coords(rank_index_of_process(process_id));
  int64_t count = 1;
  for (int m : mesh_dims) {
    SW_CHECK(m >= 0 && m < ndim(), "mesh {} has no dim {}", to_string(), m);
    count *= dim_size(m);
  }
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> c = coords;
    int64_t rest = i;
    for (size_t j = mesh_dims.size(); j-- > 0;) {
      const int m = mesh_dims[j];
      c[static_cast<size_t>(m)] = rest % dim_size(m);
      rest /= dim_size(m);
    }
    out.push_back(process_ids_[static_cast<size_t>(rank_index(c))]);
  }
  return out;
}

bool ProcessMesh::contains(int64_t process_id) const {
  return std::find(process_ids_.begin(), process_ids_.end(), process_id) != process_ids_.end();
}

std::string ProcessMesh::to_string() const {
  std::string out = "[";
  for (int d = 0; d < ndim(); ++d) {
    if (d) out += ',';
    if (!dim_names_[static_cast<size_t>(d)].empty()) out += dim_names_[static_cast<size_t>(d)] + "=";
    out += std::to_string(shape_[d]);
  }
  return out + "]";
}

ProcessMesh parse_mesh(std::string_view text) {
  std::string_view t = text;
  if (!t.empty() && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  SW_CHECK(!t.empty(), "empty mesh: write a mesh as 2,2 or dp=2,tp=2");
  Shape shape;
  std::vector<std::string> names;
  bool named = false;
  int64_t ranks = 1;
  size_t pos = 0;
  while (pos <= t.size()) {
    // "2x3" separates by 'x'; named dims ("dp=2,xp=3") only by commas.
    size_t end = t.find_first_of(t.find('=') == std::string_view::npos ? ",x" : ",", pos);
    if (end == std::string_view::npos) end = t.size();
    std::string_view part = t.substr(pos, end - pos);
    std::string name;
    size_t eq = part.find('=');
    if (eq != std::string_view::npos) {
      name = std::string(part.substr(0, eq));
      part = part.substr(eq + 1);
      named = true;
    }
    int64_t size = 0;
    auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), size);
    SW_CHECK(ec == std::errc() && p == part.data() + part.size() && size >= 1,
             "cannot read mesh '{}': '{}' is not a positive size (write 2,2 or dp=2,tp=2)", text, part);
    SW_CHECK(shape.ndim() < kMaxDims, "mesh '{}' has more than {} dims; shardwise supports at most {}", text, kMaxDims,
             kMaxDims);
    constexpr int64_t kMaxMeshRanks = int64_t{1} << 20;  // a documented bound (README): refused before allocating
    ranks = size > kMaxMeshRanks ? kMaxMeshRanks + 1 : ranks * size;
    SW_CHECK(ranks <= kMaxMeshRanks, "mesh '{}' has more than {} ranks; shardwise supports at most {}", text,
             kMaxMeshRanks, kMaxMeshRanks);
    shape.push_back(size);
    names.push_back(name);
    pos = end + 1;
  }
  if (named) {
    for (auto& n : names) SW_CHECK(!n.empty(), "mesh '{}' names some dims but not all", text);
  }
  return ProcessMesh(shape, {}, named ? names : std::vector<std::string>{});
}

}  // namespace shardwise::mesh
