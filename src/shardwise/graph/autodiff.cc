#include "shardwise/graph/autodiff.h"

#include <map>
#include <utility>

#include "shardwise/core/error.h"

namespace shardwise::graph {
namespace {

NodeId fill(Graph& g, const ops::TensorMeta& meta, double value, const std::string& name) {
  Node n;
  n.kind = NodeKind::Fill;
  n.op = "fill";
  n.attrs.set("value", value);
  return g.add_node(std::move(n), {meta}, ValueKind::Grad, {name});
}

// The gradient slot of a forward node's output k: past the op's grad_outputs, when nothing gives it
// a gradient, the output itself (never read) rather than finish's zero fill of its size.
template <class Finish>
ValueId grad_slot(const ops::OpDef& def, ValueId out, size_t k, const std::vector<ValueId>& contributions,
                  Finish& finish) {
  const bool no_grad = def.grad_outputs >= 0 && k >= static_cast<size_t>(def.grad_outputs) && contributions.empty();
  return no_grad ? out : finish(out);
}

}  // namespace

std::vector<ValueId> append_backward(Graph& g, ValueId loss, const AutodiffOptions& options) {
  SW_CHECK(g.open_segment() < 0, "append_backward: recompute segment {} is still open (call end_segment)",
           g.open_segment());
  const Value& l = g.value(loss);
  if (options.seed >= 0) {
    const Value& s = g.value(options.seed);
    SW_CHECK(s.kind == ValueKind::Input && s.meta.shape == l.meta.shape && s.meta.dtype == l.meta.dtype,
             "the seed '{}' of '{}' must be an input of the same shape and dtype ({} {}), got {} {} {}", s.name, l.name,
             dtype_name(l.meta.dtype), l.meta.shape.to_string(), value_kind_name(s.kind), dtype_name(s.meta.dtype),
             s.meta.shape.to_string());
  }
  SW_CHECK((options.seed >= 0 || l.meta.shape.numel() == 1) && is_floating(l.meta.dtype),
           "the loss '{}' must be a floating scalar (one element), got {} {}", l.name, dtype_name(l.meta.dtype),
           l.meta.shape.to_string());
  SW_CHECK(l.requires_grad, "the loss '{}' does not depend on any parameter: nothing to differentiate", l.name);
  for (const Node& n : g.nodes()) {
    SW_CHECK(n.kind == NodeKind::Forward, "append_backward: the graph already has a backward part (node {})",
             n.to_string(g));
  }
  const size_t forward_count = g.nodes().size();
  // Which forward nodes lie on a path to the loss.
  std::vector<bool> reaches(g.values().size(), false);
  reaches[static_cast<size_t>(loss)] = true;
  for (ValueId v : options.extra_losses) {
    const Value& e = g.value(v);
    SW_CHECK(e.meta.shape.numel() == 1 && is_floating(e.meta.dtype) && e.requires_grad && v != loss,
             "the extra loss '{}' must be a floating scalar that depends on a parameter, other than the loss", e.name);
    reaches[static_cast<size_t>(v)] = true;
  }
  std::vector<bool> on_path(forward_count, false);
  for (size_t i = forward_count; i-- > 0;) {
    const Node& n = g.nodes()[i];
    bool any = false;
    for (ValueId o : n.outputs) any = any || (o >= 0 && reaches[static_cast<size_t>(o)]);
    if (!any) continue;
    on_path[i] = true;
    for (ValueId v : n.inputs) {
      if (g.value(v).requires_grad) reaches[static_cast<size_t>(v)] = true;
    }
  }
  // How many gradient contributions each value will receive (one per consuming input slot).
  std::vector<int> uses(g.values().size(), 0);
  for (size_t i = 0; i < forward_count; ++i) {
    if (!on_path[i]) continue;
    for (ValueId v : g.nodes()[i].inputs) uses[static_cast<size_t>(v)] += g.value(v).requires_grad ? 1 : 0;
  }
  std::vector<std::vector<ValueId>> contributions(g.values().size());
  std::vector<int> named(g.values().size(), 0);  // contributions named so far (a node may read v twice)
  auto grad_name = [&](ValueId v) { return g.unique_name(g.value(v).name + "@grad"); };
  // Sums the contributions of v into its gradient (the Fill zeros when it has none).
  auto finish = [&](ValueId v) -> ValueId {
    auto& parts = contributions[static_cast<size_t>(v)];
    ValueId grad;
    if (parts.empty()) {
      grad = g.node(fill(g, g.value(v).meta, 0.0, grad_name(v))).outputs[0];
    } else {
      grad = parts[0];
      for (size_t k = 1; k < parts.size(); ++k) {
        std::string name = k + 1 == parts.size() ? grad_name(v) : g.unique_name(fmt::format("{}@grad+{}", g.value(v).name, k));
        grad = g.op1("add", {grad, parts[k]}, {}, name);
        g.value(grad).kind = ValueKind::Grad;
      }
    }
    g.value(v).grad = grad;
    return grad;
  };
  g.value(loss).grad = -1;
  contributions[static_cast<size_t>(loss)].push_back(
      options.seed >= 0 ? options.seed : g.node(fill(g, g.value(loss).meta, 1.0, grad_name(loss))).outputs[0]);
  for (ValueId v : options.extra_losses) {
    contributions[static_cast<size_t>(v)].push_back(
        g.node(fill(g, g.value(v).meta, 1.0, g.unique_name(g.value(v).name + "@seed"))).outputs[0]);
  }

  for (size_t i = forward_count; i-- > 0;) {
    if (!on_path[i]) continue;
    Node fwd = g.nodes()[i];  // copy: adding nodes may move the vector
    const ops::OpDef& def = ops::op_registry().get(fwd.op);
    bool any_input = false;
    for (ValueId v : fwd.inputs) any_input = any_input || g.value(v).requires_grad;
    if (!any_input) continue;
    SW_CHECK(def.has_backward(), "node {} is on the path from a parameter to the loss, but op '{}' has no gradient",
             fwd.to_string(g), fwd.op);
    Node back;
    back.kind = NodeKind::Backward;
    back.op = fwd.op;
    back.attrs = fwd.attrs;
    back.forward = fwd.id;
    back.inputs = fwd.inputs;
    back.inputs.insert(back.inputs.end(), fwd.outputs.begin(), fwd.outputs.end());
    for (size_t k = 0; k < fwd.outputs.size(); ++k)
      back.inputs.push_back(grad_slot(def, fwd.outputs[k], k, contributions[static_cast<size_t>(fwd.outputs[k])], finish));
    std::vector<ops::TensorMeta> metas;
    std::vector<std::string> names;
    for (size_t k = 0; k < fwd.inputs.size(); ++k) {
      ValueId v = fwd.inputs[k];
      metas.push_back(g.value(v).meta);
      if (!g.value(v).requires_grad) {
        names.emplace_back();
        continue;
      }
      int n = named[static_cast<size_t>(v)]++;
      names.push_back(uses[static_cast<size_t>(v)] == 1 ? grad_name(v)
                                                        : g.unique_name(fmt::format("{}@grad.{}", g.value(v).name, n)));
    }
    // Split: the parameters' gradients in a second node (same kernel, the other inputs wanted).
    std::vector<std::string> param_names(names.size());
    bool has_param = false, has_other = false;
    for (size_t k = 0; k < names.size(); ++k) {
      if (names[k].empty()) continue;
      bool is_param = g.value(fwd.inputs[k]).kind == ValueKind::Param;
      (is_param ? has_param : has_other) = true;
      if (is_param) param_names[k] = std::exchange(names[k], std::string());
    }
    std::vector<NodeId> made;
    if (options.split_param_grads && def.backward_partial && has_param && has_other) {
      Node weights = back;
      made.push_back(g.add_node(std::move(back), metas, ValueKind::Grad, names));
      made.push_back(g.add_node(std::move(weights), metas, ValueKind::Grad, param_names));
    } else {
      for (size_t k = 0; k < names.size(); ++k) {
        if (!param_names[k].empty()) names[k] = param_names[k];
      }
      made.push_back(g.add_node(std::move(back), metas, ValueKind::Grad, names));
    }
    for (NodeId b : made) {
      for (size_t k = 0; k < fwd.inputs.size(); ++k) {
        ValueId out = g.node(b).outputs[k];
        if (out >= 0) contributions[static_cast<size_t>(fwd.inputs[k])].push_back(out);
      }
    }
  }
  // Inputs that take a gradient (a pipeline stage's input).
  for (ValueId v : g.inputs()) {
    if (g.value(v).requires_grad && !contributions[static_cast<size_t>(v)].empty()) finish(v);
  }
  std::vector<ValueId> grads;
  for (ValueId p : g.params()) {
    if (contributions[static_cast<size_t>(p)].empty()) {
      SW_CHECK(options.allow_unused_params, "parameter '{}' has no gradient path to the loss '{}' (is it used?)",
               g.value(p).name, g.value(loss).name);
      grads.push_back(-1);
      continue;
    }
    grads.push_back(finish(p));
  }
  return grads;
}

}  // namespace shardwise::graph
