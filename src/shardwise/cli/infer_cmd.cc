// `shardwise infer`: asks an op's rule what its inputs need and what its outputs get, and shows
// every rank's local shapes.
#include <fmt/format.h>

#include "shardwise/cli/commands.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/op.h"
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
  const ops::OpDef& op = ops::op_registry().get(o.op);
  const spmd::Rule& rule = op.rule;
  mesh::ProcessMesh mesh = mesh::parse_mesh(o.mesh);
  SW_CHECK(mesh.size() <= kMaxInferRanks, "mesh {} has {} ranks; infer lists each rank's block, for at most {} ranks",
           mesh.to_string(), mesh.size(), kMaxInferRanks);
  std::vector<Shape> shapes = parse_shapes(o.shapes);
  SW_CHECK(op.num_inputs < 0 || static_cast<int>(shapes.size()) == op.num_inputs,
           "op '{}' takes {} inputs but --shapes gives {}", op.name, op.num_inputs, shapes.size());
  std::vector<ops::TensorMeta> in_meta;
  std::vector<std::string> dtypes = o.dtypes.empty() ? std::vector<std::string>{} : split(o.dtypes, ',');
  SW_CHECK(dtypes.empty() || dtypes.size() == shapes.size(), "--dtypes gives {} dtypes for {} inputs", dtypes.size(),
           shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    in_meta.push_back({shapes[i], dtypes.empty() ? DType::F32 : parse_dtype(dtypes[i])});
  }
  Attrs attrs = parse_attrs(o.attrs);
  std::vector<ops::TensorMeta> out_meta = ops::infer_checked(op, in_meta, attrs);

  std::vector<std::string> lists = split(o.placements, ';');
  auto to_specs = [&](const std::vector<ops::TensorMeta>& metas, size_t first, const char* what) {
    std::vector<spmd::TensorSpec> specs;
    for (size_t i = 0; i < metas.size(); ++i) {
      mesh::DistAttr dist = mesh::parse_dist(lists[first + i], mesh.ndim());
      dist.validate(metas[i].shape.ndim(), mesh.ndim(), fmt::format("{} {} ({})", what, i, metas[i].shape.to_string()));
      specs.push_back({metas[i].shape, metas[i].dtype, dist});
    }
    return specs;
  };
  spmd::SpmdResult result;
  std::vector<ops::TensorMeta> shown_in = in_meta, shown_out = out_meta;
  if (o.part == "forward") {
    SW_CHECK(lists.size() == in_meta.size(), "--placements gives {} lists for {} inputs (separate lists with ';')",
             lists.size(), in_meta.size());
    result = rule.forward(mesh, to_specs(in_meta, 0, "input"), attrs);
  } else if (o.part == "reverse") {
    SW_CHECK(lists.size() == out_meta.size(), "--part reverse: --placements gives {} lists for {} outputs",
             lists.size(), out_meta.size());
    std::vector<spmd::TensorSpec> in_specs;
    for (const auto& m : in_meta) in_specs.push_back({m.shape, m.dtype, mesh::DistAttr(mesh.ndim())});
    result = rule.reverse(mesh, in_specs, to_specs(out_meta, 0, "output"), attrs);
  } else {
    // grad: placements of the inputs, then of the output grads; outputs take the forward rule's.
    SW_CHECK(op.has_backward(), "op '{}' has no gradient", op.name);
    SW_CHECK(lists.size() == in_meta.size() + out_meta.size(),
             "--part grad: --placements gives {} lists; expected {} (inputs, then output grads)", lists.size(),
             in_meta.size() + out_meta.size());
    std::vector<spmd::TensorSpec> specs = to_specs(in_meta, 0, "input");
    spmd::SpmdResult fwd = rule.forward(mesh, specs, attrs);
    for (size_t i = 0; i < out_meta.size(); ++i) specs.push_back({out_meta[i].shape, out_meta[i].dtype, fwd.outputs[i]});
    auto grads = to_specs(out_meta, in_meta.size(), "output grad");
    specs.insert(specs.end(), grads.begin(), grads.end());
    result = rule.grad(mesh, specs, attrs);
    shown_in = in_meta;
    shown_in.insert(shown_in.end(), out_meta.begin(), out_meta.end());
    shown_in.insert(shown_in.end(), out_meta.begin(), out_meta.end());
    shown_out = in_meta;
  }
  out << fmt::format("{} ({} rule '{}') on mesh {}\n", op.name, o.part, rule.name, mesh.to_string());
  out << "required inputs:\n";
  for (size_t i = 0; i < result.inputs.size() && i < shown_in.size(); ++i) {
    print_locals(out, "input", i, shown_in[i], result.inputs[i], mesh);
  }
  out << (o.part == "grad" ? "input gradients:\n" : "outputs:\n");
  for (size_t i = 0; i < result.outputs.size() && i < shown_out.size(); ++i) {
    print_locals(out, o.part == "grad" ? "grad" : "output", i, shown_out[i], result.outputs[i], mesh);
  }
  return 0;
}

}  // namespace shardwise::cli
