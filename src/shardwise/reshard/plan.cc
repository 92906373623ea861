#include "shardwise/reshard/plan.h"

#include <charconv>

#include "shardwise/core/error.h"

namespace shardwise::reshard {

std::string Layout::to_string() const {
  std::string out = "mesh=" + mesh.to_string();
  bool default_ids = true;
  for (int64_t i = 0; i < mesh.size(); ++i) default_ids = default_ids && mesh.process_ids()[static_cast<size_t>(i)] == i;
  if (!default_ids) out += fmt::format(" ranks={}", fmt::join(mesh.process_ids(), ","));
  return out + " " + dist.to_string();
}

namespace {

int64_t read_int(std::string_view s, std::string_view whole) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  SW_CHECK(ec == std::errc() && p == s.data() + s.size() && v >= 0,
           "cannot read layout '{}': '{}' is not a rank number", whole, s);
  return v;
}

std::vector<int64_t> parse_ranks(std::string_view text, std::string_view whole) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(pos, end - pos);
    size_t dash = part.find('-');
    if (dash == std::string_view::npos) {
      out.push_back(read_int(part, whole));
    } else {
      int64_t a = read_int(part.substr(0, dash), whole), b = read_int(part.substr(dash + 1), whole);
      SW_CHECK(a <= b, "cannot read layout '{}': rank range {} is empty", whole, part);
      for (int64_t r = a; r <= b; ++r) out.push_back(r);
    }
    pos = end + 1;
  }
  return out;
}

}  // namespace

Layout parse_layout(std::string_view text) {
  std::string_view mesh_text, ranks_text, dist_text;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view word = text.substr(pos, end - pos);
    if (word.starts_with("mesh=")) mesh_text = word.substr(5);
    else if (word.starts_with("ranks=")) ranks_text = word.substr(6);
    else if (!word.empty()) {
      SW_CHECK(dist_text.empty(), "cannot read layout '{}': two placement lists ('{}' and '{}')", text, dist_text, word);
      dist_text = word;
    }
    pos = end + 1;
  }
  SW_CHECK(!mesh_text.empty(), "layout '{}' names no mesh: write e.g. \"mesh=2x2 S(0),R\"", text);
  SW_CHECK(!dist_text.empty(), "layout '{}' has no placements: write e.g. \"mesh=2x2 S(0),R\"", text);
  mesh::ProcessMesh m = mesh::parse_mesh(mesh_text);
  if (!ranks_text.empty()) {
    std::vector<int64_t> ids = parse_ranks(ranks_text, text);
    SW_CHECK(static_cast<int64_t>(ids.size()) == m.size(), "layout '{}': mesh {} has {} ranks but {} are listed", text,
             m.to_string(), m.size(), ids.size());
    m = mesh::ProcessMesh(m.shape(), ids, m.dim_names());
  }
  return {m, mesh::parse_dist(dist_text, m.ndim())};
}

double CostModel::alpha(int mesh_dim) const {
  auto m = static_cast<size_t>(mesh_dim);
  return m < dim_alpha_s.size() && dim_alpha_s[m] > 0 ? dim_alpha_s[m] : alpha_s;
}

double CostModel::bandwidth(int mesh_dim) const {
  auto m = static_cast<size_t>(mesh_dim);
  return m < dim_bandwidth_Bps.size() && dim_bandwidth_Bps[m] > 0 ? dim_bandwidth_Bps[m] : bandwidth_Bps;
}

std::string_view step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::AllReduce: return "all_reduce";
    case StepKind::ReduceScatter: return "reduce_scatter";
    case StepKind::AllGather: return "all_gather";
    case StepKind::AllToAll: return "all_to_all";
    case StepKind::LocalSlice: return "local_slice";
    case StepKind::Partialize: return "partialize";
    case StepKind::Redistribute: return "redistribute";
    case StepKind::SendRecv: return "send_recv";
  }
  return "?";
}

std::string Step::to_string() const {
  std::string what(step_kind_name(kind));
  switch (kind) {
    case StepKind::AllReduce: what += fmt::format("({}) along mesh dim {}", mesh::reduce_op_name(op), mesh_dim); break;
    case StepKind::ReduceScatter:
      what += fmt::format("({}) along mesh dim {} onto tensor dim {}", mesh::reduce_op_name(op), mesh_dim, tensor_dim);
      break;
    case StepKind::AllGather: what += fmt::format(" along mesh dim {} of tensor dim {}", mesh_dim, tensor_dim); break;
    case StepKind::AllToAll:
      what += fmt::format(" along mesh dim {}: tensor dim {} -> {}", mesh_dim, tensor_dim, to_tensor_dim);
      break;
    case StepKind::Partialize: what += fmt::format("({}) on mesh dim {}", mesh::reduce_op_name(op), mesh_dim); break;
    case StepKind::Redistribute: what += fmt::format(" among mesh dims [{}]", fmt::join(group_dims, ",")); break;
    case StepKind::LocalSlice:
    case StepKind::SendRecv: break;
  }
  bool moves = kind == StepKind::SendRecv;  // between meshes: show them
  return fmt::format("{:<52} {} -> {}   {} B, {:.3g} us", what, moves ? before.to_string() : before.dist.to_string(),
                     moves ? after.to_string() : after.dist.to_string(), bytes, cost_s * 1e6);
}

std::string Plan::to_string() const {
  std::string out = fmt::format("reshard {} {} ({} B)\n  from {}\n  to   {}\n", shape.to_string(), dtype_name(dtype),
                                shape.numel() * static_cast<int64_t>(dtype_size(dtype)), from.to_string(),
                                to.to_string());
  if (steps.empty()) return out + "  nothing to do: the layouts are the same\n";
  for (size_t i = 0; i < steps.size(); ++i) out += fmt::format("  {}. {}\n", i + 1, steps[i].to_string());
  return out + fmt::format("  total: {} step(s), {} B sent by the busiest rank, {:.3g} us ({})\n", steps.size(),
                           bytes, cost_s * 1e6, strategy);
}

}  // namespace shardwise::reshard
