#include "shardwise/graph/graph.h"

#include <algorithm>

#include "shardwise/core/error.h"

namespace shardwise::graph {

std::string_view value_kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::Input: return "input";
    case ValueKind::Param: return "param";
    case ValueKind::Frozen: return "frozen";
    case ValueKind::Activation: return "activation";
    case ValueKind::Grad: return "grad";
  }
  return "?";
}

std::string Node::to_string(const Graph& g) const {
  auto names = [&](const std::vector<ValueId>& ids) {
    std::vector<std::string> out;
    for (ValueId v : ids) out.push_back(v >= 0 ? g.value(v).name : "_");
    return out;
  };
  std::string call = kind == NodeKind::Backward ? "grad_" + op : op;
  std::string attr = attrs.empty() ? "" : "; " + attrs.to_string();
  return fmt::format("{} = {}({}{})", fmt::join(names(outputs), ", "), call, fmt::join(names(inputs), ", "), attr);
}

ValueId Graph::new_value(std::string name, ops::TensorMeta meta, ValueKind kind) {
  SW_CHECK(!name.empty(), "a value needs a name");
  SW_CHECK(!by_name_.contains(name), "the name '{}' is used twice (value names are unique)", name);
  Value v;
  v.id = static_cast<ValueId>(values_.size());
  v.name = name;
  v.meta = meta;
  v.kind = kind;
  v.requires_grad = kind == ValueKind::Param;
  values_.push_back(std::move(v));
  by_name_.emplace(std::move(name), values_.back().id);
  return values_.back().id;
}

ValueId Graph::input(std::string name, const Shape& shape, DType dtype) {
  return new_value(std::move(name), {shape, dtype}, ValueKind::Input);
}

ValueId Graph::param(std::string name, const Shape& shape, DType dtype) {
  SW_CHECK(is_floating(dtype), "parameter '{}' must have a floating dtype, got {}", name, dtype_name(dtype));
  return new_value(std::move(name), {shape, dtype}, ValueKind::Param);
}

ValueId Graph::frozen(std::string name, const Shape& shape, DType dtype) {
  SW_CHECK(is_floating(dtype), "frozen parameter '{}' must have a floating dtype, got {}", name, dtype_name(dtype));
  return new_value(std::move(name), {shape, dtype}, ValueKind::Frozen);
}

std::string Graph::unique_name(std::string base) const {
  if (!find(base)) return base;
  for (int i = 1;; ++i) {
    std::string candidate = fmt::format("{}_{}", base, i);
    if (!find(candidate)) return candidate;
  }
}

NodeId Graph::add_node(Node node, const std::vector<ops::TensorMeta>& output_metas, ValueKind output_kind,
                       const std::vector<std::string>& output_names) {
  node.id = static_cast<NodeId>(nodes_.size());
  node.outputs.assign(output_metas.size(), -1);
  for (size_t i = 0; i < output_metas.size(); ++i) {
    if (output_names[i].empty()) continue;  // a Backward output that is not needed
    ValueId v = new_value(output_names[i], output_metas[i], output_kind);
    values_[static_cast<size_t>(v)].producer = node.id;
    values_[static_cast<size_t>(v)].producer_output = static_cast<int>(i);
    node.outputs[i] = v;
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().id;
}

int Graph::begin_segment() {
  SW_CHECK(open_segment_ < 0, "begin_segment: segment {} is still open (segments do not nest)", open_segment_);
  open_segment_ = segments_++;
  return open_segment_;
}

void Graph::end_segment() {
  SW_CHECK(open_segment_ >= 0, "end_segment: no segment is open");
  open_segment_ = -1;
}

std::vector<ValueId> Graph::op(std::string_view op_name, std::vector<ValueId> inputs, Attrs attrs, std::string name) {
  const ops::OpDef& def = ops::op_registry().get(op_name);
  std::vector<ops::TensorMeta> in;
  bool requires_grad = false;
  for (ValueId v : inputs) {
    in.push_back(value(v).meta);
    requires_grad = requires_grad || value(v).requires_grad;
  }
  if (name.empty()) name = fmt::format("{}_{}", op_name, nodes_.size());
  std::vector<ops::TensorMeta> out;
  try {
    out = ops::infer_checked(def, in, attrs);
  } catch (const Error& e) {
    std::vector<std::string> described;
    for (ValueId v : inputs) described.push_back(fmt::format("{} {}", value(v).name, value(v).meta.shape.to_string()));
    fail("node '{}' ({}({})): {}", name, op_name, fmt::join(described, ", "), e.what());
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < out.size(); ++i) names.push_back(i == 0 ? name : fmt::format("{}:{}", name, i));
  Node node;
  node.kind = NodeKind::Forward;
  node.op = std::string(op_name);
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  node.segment = open_segment_;
  NodeId id = add_node(std::move(node), out, ValueKind::Activation, names);
  for (ValueId v : nodes_[static_cast<size_t>(id)].outputs) {
    values_[static_cast<size_t>(v)].requires_grad = requires_grad && is_floating(value(v).meta.dtype) && def.has_backward();
  }
  return nodes_[static_cast<size_t>(id)].outputs;
}

ValueId Graph::op1(std::string_view op_name, std::vector<ValueId> inputs, Attrs attrs, std::string name) {
  return op(op_name, std::move(inputs), std::move(attrs), std::move(name)).front();
}

ValueId Graph::matmul(ValueId x, ValueId y, bool trans_y, std::string name) {
  Attrs a;
  if (trans_y) a.set("trans_y", true);
  return op1("matmul", {x, y}, a, std::move(name));
}
ValueId Graph::add(ValueId x, ValueId y, std::string name) { return op1("add", {x, y}, {}, std::move(name)); }
ValueId Graph::multiply(ValueId x, ValueId y, std::string name) { return op1("multiply", {x, y}, {}, std::move(name)); }
ValueId Graph::gelu(ValueId x, std::string name) { return op1("gelu", {x}, {}, std::move(name)); }
ValueId Graph::relu(ValueId x, std::string name) { return op1("relu", {x}, {}, std::move(name)); }
ValueId Graph::scale(ValueId x, double s, double bias, std::string name) {
  return op1("scale", {x}, {{"scale", s}, {"bias", bias}}, std::move(name));
}
ValueId Graph::sum(ValueId x, std::vector<int64_t> axis, bool keepdim, std::string name) {
  return op1("sum", {x}, {{"axis", std::move(axis)}, {"keepdim", keepdim}}, std::move(name));
}
ValueId Graph::mean(ValueId x, std::vector<int64_t> axis, bool keepdim, std::string name) {
  return op1("mean", {x}, {{"axis", std::move(axis)}, {"keepdim", keepdim}}, std::move(name));
}
ValueId Graph::softmax(ValueId x, int64_t axis, std::string name) {
  return op1("softmax", {x}, {{"axis", axis}}, std::move(name));
}
ValueId Graph::layer_norm(ValueId x, ValueId s, ValueId b, int64_t begin_norm_axis, double epsilon, std::string name) {
  return op1("layer_norm", {x, s, b}, {{"begin_norm_axis", begin_norm_axis}, {"epsilon", epsilon}}, std::move(name));
}
ValueId Graph::embedding(ValueId ids, ValueId weight, std::string name) {
  return op1("embedding", {ids, weight}, {}, std::move(name));
}
ValueId Graph::reshape(ValueId x, std::vector<int64_t> shape, std::string name) {
  return op1("reshape", {x}, {{"shape", std::move(shape)}}, std::move(name));
}
ValueId Graph::transpose(ValueId x, std::vector<int64_t> perm, std::string name) {
  return op1("transpose", {x}, {{"perm", std::move(perm)}}, std::move(name));
}
ValueId Graph::cross_entropy(ValueId logits, ValueId labels, std::string reduction, std::string name) {
  return op1("cross_entropy", {logits, labels}, {{"reduction", std::move(reduction)}}, std::move(name));
}

void Graph::annotate(ValueId v, const mesh::DistAttr& dist) {
  Value& val = value(v);
  dist.validate(val.meta.shape.ndim(), dist.mesh_ndim(), fmt::format("the annotation of '{}'", val.name));
  val.annotation = dist;
}

void Graph::annotate(ValueId v, std::string_view placements) { annotate(v, mesh::parse_dist(placements)); }

const Value& Graph::value(ValueId v) const {
  SW_CHECK(v >= 0 && static_cast<size_t>(v) < values_.size(), "value id {} does not exist (the graph has {})", v,
           values_.size());
  return values_[static_cast<size_t>(v)];
}
Value& Graph::value(ValueId v) { return const_cast<Value&>(std::as_const(*this).value(v)); }
const Node& Graph::node(NodeId n) const {
  SW_CHECK(n >= 0 && static_cast<size_t>(n) < nodes_.size(), "node id {} does not exist (the graph has {})", n,
           nodes_.size());
  return nodes_[static_cast<size_t>(n)];
}
Node& Graph::node(NodeId n) { return const_cast<Node&>(std::as_const(*this).node(n)); }

std::optional<ValueId> Graph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

ValueId Graph::get(std::string_view name) const {
  if (auto v = find(name)) return *v;
  std::vector<std::string_view> near;
  for (const auto& [n, id] : by_name_) {
    if (n.find(name) != std::string::npos || name.find(n) != std::string_view::npos) near.push_back(n);
  }
  std::sort(near.begin(), near.end());
  fail("no value named '{}'{}", name, near.empty() ? "" : fmt::format(" (similar: {})", fmt::join(near, ", ")));
}

std::vector<ValueId> Graph::params() const {
  std::vector<ValueId> out;
  for (const Value& v : values_) {
    if (v.kind == ValueKind::Param) out.push_back(v.id);
  }
  return out;
}

std::vector<ValueId> Graph::frozen_params() const {
  std::vector<ValueId> out;
  for (const Value& v : values_) {
    if (v.kind == ValueKind::Frozen) out.push_back(v.id);
  }
  return out;
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> out;
  for (const Value& v : values_) {
    if (v.kind == ValueKind::Input) out.push_back(v.id);
  }
  return out;
}

}  // namespace shardwise::graph
