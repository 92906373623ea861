#include "shardwise/graph/recompute.h"

#include <algorithm>
#include <map>

#include "shardwise/core/error.h"

namespace shardwise::graph {

RecomputeResult apply_recompute(Graph& g, Completion& c) {
  RecomputeResult r;
  const size_t total = g.nodes().size();
  SW_CHECK(c.node_inputs.size() == total && c.dist.size() == g.values().size(),
           "apply_recompute: the completion covers {} nodes and {} values, the graph has {} and {}", c.node_inputs.size(),
           c.dist.size(), total, g.values().size());
  size_t forward = 0;  // autodiff appends: the forward nodes come first
  while (forward < total && g.nodes()[forward].kind == NodeKind::Forward) ++forward;
  auto producer = [&](ValueId v) { return g.value(v).producer; };
  // The segment whose forward nodes made v (-1: outside every segment, or not a forward value).
  auto segment_of = [&](ValueId v) {
    NodeId p = producer(v);
    return p < 0 || static_cast<size_t>(p) >= forward ? -1 : g.node(p).segment;
  };
  // Does Backward node b read the value of its operand k, a value its forward node's segment made?
  auto recomputed_read = [&](const Node& b, size_t k) {
    const Node& f = g.node(b.forward);
    return k < f.inputs.size() + f.outputs.size() && f.segment >= 0 && segment_of(b.inputs[k]) == f.segment &&
           ops::op_registry().get(b.op).backward_reads_value(static_cast<int>(k), b.attrs);
  };
  // 1. The forward nodes to repeat: the producers of what the gradients read, and their in-segment inputs.
  std::vector<bool> repeat(forward, false);
  for (size_t i = forward; i < total; ++i) {
    const Node& b = g.nodes()[i];
    if (b.kind != NodeKind::Backward) continue;
    for (size_t k = 0; k < b.inputs.size(); ++k)
      if (recomputed_read(b, k)) repeat[static_cast<size_t>(producer(b.inputs[k]))] = true;
  }
  for (size_t i = forward; i-- > 0;) {
    if (!repeat[i]) continue;
    const Node& f = g.nodes()[i];
    for (ValueId v : f.inputs)
      if (segment_of(v) == f.segment) repeat[static_cast<size_t>(producer(v))] = true;
  }
  // 2. The copies, in forward order, laid out as the originals.
  std::vector<ValueId> copy_of(g.values().size(), -1);
  for (size_t i = 0; i < forward; ++i) {
    if (!repeat[i]) continue;
    const Node f = g.nodes()[i];  // a copy: add_node may move the vector
    Node n;
    n.op = f.op;
    n.attrs = f.attrs;
    n.recomputes = f.id;
    for (ValueId v : f.inputs) n.inputs.push_back(copy_of[static_cast<size_t>(v)] >= 0 ? copy_of[static_cast<size_t>(v)] : v);
    std::vector<ops::TensorMeta> metas;
    std::vector<std::string> names;
    for (ValueId o : f.outputs) {
      metas.push_back(g.value(o).meta);
      names.push_back(g.unique_name(g.value(o).name + "@recompute"));
    }
    NodeId id = g.add_node(std::move(n), metas, ValueKind::Activation, names);
    std::vector<mesh::DistAttr> ins = c.node_inputs[i], outs = c.node_outputs[i];
    c.node_inputs.push_back(std::move(ins));
    c.node_outputs.push_back(std::move(outs));
    copy_of.resize(g.values().size(), -1);
    for (size_t k = 0; k < f.outputs.size(); ++k) {
      ValueId orig = f.outputs[k], o = g.node(id).outputs[k];
      SW_CHECK(static_cast<size_t>(o) == c.dist.size(), "apply_recompute: value {} out of order", g.value(o).name);
      g.value(o).requires_grad = g.value(orig).requires_grad;
      g.value(o).annotation = g.value(orig).annotation;
      g.value(orig).recompute_copy = o;
      copy_of[static_cast<size_t>(orig)] = o;
      mesh::DistAttr d = c.dist[static_cast<size_t>(orig)];
      c.dist.push_back(std::move(d));
      c.why.push_back(fmt::format("recomputed copy of '{}'", g.value(orig).name));
    }
    ++r.copies;
  }
  // 3. The gradients read the copies; each segment's copies run right before their first reader.
  std::map<int, size_t> first_reader;  // segment -> node
  for (size_t i = forward; i < total; ++i) {
    Node& b = g.node(static_cast<NodeId>(i));
    if (b.kind != NodeKind::Backward) continue;
    for (size_t k = 0; k < b.inputs.size(); ++k) {
      if (!recomputed_read(b, k)) continue;
      int segment = g.node(b.forward).segment;
      b.inputs[k] = copy_of[static_cast<size_t>(b.inputs[k])];
      if (!first_reader.contains(segment)) first_reader[segment] = i;
    }
  }
  std::map<size_t, std::vector<NodeId>> before;  // node -> the copies to run before it
  for (size_t i = total; i < g.nodes().size(); ++i) {
    int segment = g.node(g.nodes()[i].recomputes).segment;
    before[first_reader.at(segment)].push_back(static_cast<NodeId>(i));
  }
  for (size_t i = 0; i < total; ++i) {
    if (auto it = before.find(i); it != before.end()) r.order.insert(r.order.end(), it->second.begin(), it->second.end());
    r.order.push_back(static_cast<NodeId>(i));
  }
  return r;
}

}  // namespace shardwise::graph
