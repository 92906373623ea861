// `shardwise infer`: asks an op's rule what its inputs need and what its outputs get, and shows
// every rank's local shapes.
#include <fmt/format.h>

#include "shardwise/cli/commands.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/ask_rule.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::cli {
namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t end = text.find(sep, pos);
    out.push_back(text.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

// Shapes are separated by commas, but a shape may itself be written 8,16 inside brackets.
std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = pos;
    int depth = 0;
    while (end < text.size() && (text[end] != ',' || depth > 0)) {
      depth += text[end] == '[' ? 1 : text[end] == ']' ? -1 : 0;
      ++end;
    }
    out.push_back(parse_shape(text.substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

void print_locals(std::ostream& out, const char* kind, size_t index, const ops::TensorMeta& meta,
                  const mesh::DistAttr& dist, const mesh::ProcessMesh& mesh) {
  out << fmt::format("  {} {}: {} {} [{}]\n", kind, index, dtype_name(meta.dtype), meta.shape.to_string(),
                     dist.to_string());
  for (int64_t r = 0; r < mesh.size(); ++r) {
    mesh::LocalBlock b = mesh::local_block(meta.shape, dist, mesh, mesh.coords(r));
    out << fmt::format("      rank {} {}: local {} at offset [{}]\n", mesh.process_ids()[static_cast<size_t>(r)],
                       fmt::join(mesh.coords(r), ","), b.shape.to_string(), fmt::join(b.offsets(), ","));
  }
}

}  // namespace

int cmd_infer(const InferOptions& o, std::ostream& out) {
  ops::RuleQuestion q{o.op, o.part, mesh::parse_mesh(o.mesh), {}, {}, parse_attrs(o.attrs)};
  const ops::OpDef& op = ops::op_registry().get(o.op);
  SW_CHECK(q.mesh.size() <= kMaxInferRanks, "mesh {} has {} ranks; infer lists each rank's block, for at most {} ranks",
           q.mesh.to_string(), q.mesh.size(), kMaxInferRanks);
  std::vector<Shape> shapes = parse_shapes(o.shapes);
  SW_CHECK(op.num_inputs < 0 || static_cast<int>(shapes.size()) == op.num_inputs,
           "op '{}' takes {} inputs but --shapes gives {}", op.name, op.num_inputs, shapes.size());
  std::vector<std::string> dtypes = o.dtypes.empty() ? std::vector<std::string>{} : split(o.dtypes, ',');
  SW_CHECK(dtypes.empty() || dtypes.size() == shapes.size(), "--dtypes gives {} dtypes for {} inputs", dtypes.size(),
           shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    q.inputs.push_back({shapes[i], dtypes.empty() ? DType::F32 : parse_dtype(dtypes[i])});
  }
  std::vector<std::string> lists = split(o.placements, ';');
  size_t wanted = o.part == "forward"   ? q.inputs.size()
                  : o.part == "reverse" ? ops::infer_checked(op, q.inputs, q.attrs).size()
                                        : q.inputs.size() + ops::infer_checked(op, q.inputs, q.attrs).size();
  SW_CHECK(lists.size() == wanted, "--placements gives {} lists; the {} rule of '{}' takes {} (separate lists with ';')",
           lists.size(), o.part, op.name, wanted);
  for (const std::string& list : lists) q.placements.push_back(mesh::parse_dist(list, q.mesh.ndim()));
  ops::RuleAnswer a = ops::ask_rule(q);
  out << fmt::format("{} ({} rule '{}') on mesh {}\n", a.op, a.part, a.rule, q.mesh.to_string());
  out << "required inputs:\n";
  for (size_t i = 0; i < a.result.inputs.size() && i < a.required.size(); ++i) {
    print_locals(out, "input", i, a.required[i], a.result.inputs[i], q.mesh);
  }
  out << (a.part == "grad" ? "input gradients:\n" : "outputs:\n");
  for (size_t i = 0; i < a.result.outputs.size() && i < a.produced.size(); ++i) {
    print_locals(out, a.part == "grad" ? "grad" : "output", i, a.produced[i], a.result.outputs[i], q.mesh);
  }
  return 0;
}

}  // namespace shardwise::cli
