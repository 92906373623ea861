#include "shardwise/mesh/strategy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "shardwise/core/error.h"

namespace shardwise::mesh {

Strategy Strategy::from_mesh(const ProcessMesh& mesh, bool sequence_parallel) {
  Strategy s;
  s.mesh = mesh;
  s.sequence_parallel = sequence_parallel;
  const auto& names = mesh.dim_names();
  for (int m = 0; m < mesh.ndim(); ++m) {
    std::string n = names.empty() ? "" : names[static_cast<size_t>(m)];
    if (n == "dp") s.dp = m;
    else if (n == "tp") s.tp = m;
    else if (n == "pp") s.pp = m;
    else if (n == "ep") s.ep = m;
    else if (n == "cp") s.cp = m;
    else
      fail("mesh {}: dim {} is named '{}'; name every dim dp, tp, pp, ep or cp (e.g. dp=2,tp=2)", mesh.to_string(), m,
           n.empty() ? "(unnamed)" : n);
  }
  SW_CHECK(!sequence_parallel || s.tp >= 0, "sequence parallelism (--sp) runs on the tp dim: the mesh {} has none",
           mesh.to_string());
  return s;
}

std::string Strategy::placements(const char* on_tp, const char* on_data, const char* on_cp) const {
  std::vector<std::string> parts(static_cast<size_t>(mesh.ndim()), "R");
  if (tp >= 0) parts[static_cast<size_t>(tp)] = on_tp;
  if (dp >= 0) parts[static_cast<size_t>(dp)] = on_data;
  if (ep >= 0) parts[static_cast<size_t>(ep)] = on_data;
  if (cp >= 0) parts[static_cast<size_t>(cp)] = on_cp != nullptr ? on_cp : std::string(on_data) == "S(0)" ? "S(1)" : "R";
  return fmt::format("{}", fmt::join(parts, ","));
}

int64_t Strategy::data_index(std::span<const int64_t> coords) const {
  int64_t index = 0;
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (d == dp || d == ep) index = index * mesh.dim_size(d) + coords[static_cast<size_t>(d)];
  }
  return index;
}

std::vector<int> Strategy::data_dims() const {
  std::vector<int> out;
  for (int d = 0; d < mesh.ndim(); ++d)
    if (d == dp || d == ep || d == cp) out.push_back(d);
  return out;
}

std::string Strategy::to_string() const {
  return fmt::format("mesh {}{}", mesh.to_string(), sequence_parallel ? " + sequence parallel" : "");
}

}  // namespace shardwise::mesh
