#include "shardwise/graph/program.h"

#include <map>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"

namespace shardwise::graph {
namespace {

using mesh::DistAttr;

class Lowerer {
 public:
  Lowerer(const Graph& g, const Completion& c, const LowerOptions& options)
      : g_(g),
        c_(c),
        cost_(options.cost),
        order_(options.order),
        partial_dims_(options.partial_grad_dims),
        regather_(options.regather_params) {
    p_.mesh = c.mesh;
    p_.value_slot.assign(g.values().size(), -1);
  }

  Program run() {
    for (const Value& v : g_.values()) {
      if (v.producer < 0) p_.value_slot[static_cast<size_t>(v.id)] = slot(v.id, c_.dist[static_cast<size_t>(v.id)]);
    }
    const std::vector<ValueId> params = g_.params();
    p_.param_grad_slot.assign(params.size(), -1);
    std::map<ValueId, size_t> grad_of;  // regather_params: gradient value -> parameter index
    if (regather_) {
      for (size_t i = 0; i < params.size(); ++i)
        if (g_.value(params[i]).grad >= 0) grad_of[g_.value(params[i]).grad] = i;
    }
    const std::vector<bool> dead = dead_param_casts();
    auto lower_and_reduce = [&](const Node& n) {
      if (dead[static_cast<size_t>(n.id)]) return;
      lower(n);
      // Stage 3: a gradient is reduce-scattered as soon as it is complete, so the full sum does not
      // wait for the end of the backward (every full gradient would be alive there at once).
      for (ValueId o : n.outputs)
        if (auto it = grad_of.find(o); it != grad_of.end()) p_.param_grad_slot[it->second] = reduce_grad(params[it->second]);
    };
    if (order_.empty()) {
      for (const Node& n : g_.nodes()) lower_and_reduce(n);
    } else {
      SW_CHECK(order_.size() == g_.nodes().size(), "lower: the order names {} of the {} nodes", order_.size(),
               g_.nodes().size());
      for (NodeId n : order_) lower_and_reduce(g_.node(n));
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (p_.param_grad_slot[i] < 0 && g_.value(params[i]).grad >= 0) p_.param_grad_slot[i] = reduce_grad(params[i]);
    return std::move(p_);
  }

 private:
  // Casts of a stored parameter whose result no node reads: a --bf16 parameter's f32 copy where
  // every reader takes the bf16 parameter itself (bf16 compute's GEMMs). Not lowered, so no frame
  // holds a copy no one reads.
  std::vector<bool> dead_param_casts() const {
    std::vector<bool> read(g_.values().size(), false), dead(g_.nodes().size(), false);
    for (const Node& n : g_.nodes())
      for (ValueId v : n.inputs)
        if (v >= 0) read[static_cast<size_t>(v)] = true;
    for (const Node& n : g_.nodes())
      dead[static_cast<size_t>(n.id)] = n.kind == NodeKind::Forward && n.op == "cast" && n.inputs.size() == 1 &&
                                         g_.value(n.inputs[0]).producer < 0 && n.outputs.size() == 1 &&
                                         !read[static_cast<size_t>(n.outputs[0])];
    return dead;
  }

  // The slot of parameter p's gradient in p's distribution (Partial kept on partial_dims_).
  int reduce_grad(ValueId p) {
    const ValueId grad = g_.value(p).grad;
    DistAttr want = c_.dist[static_cast<size_t>(p)];
    const DistAttr& got = p_.slots[static_cast<size_t>(slot_of(grad))].dist;
    for (int d : partial_dims_) {
      if (got[d].is_partial() && want[d].is_replicate()) want.set(d, got[d]);
    }
    return in_dist(grad, slot_of(grad), want);
  }

  // A parameter's copy in another distribution than its own carries the reader's tag under
  // regather_params (a fresh all-gather per tag), every other slot is keyed by value and distribution.
  std::string key(ValueId v, const DistAttr& d) const {
    std::string k = fmt::format("{}|{}", v, d.to_string());
    if (!tag_.empty() && g_.value(v).kind == ValueKind::Param && d != c_.dist[static_cast<size_t>(v)]) k += tag_;
    return k;
  }
  // The regather tag of node n's reads: each plain forward node its own; a recompute copy and the
  // Backward nodes of a segment's nodes share the segment's (the copies run right before the
  // segment's backward); other Backward nodes their own.
  std::string regather_tag(const Node& n) const {
    if (!regather_) return "";
    int segment = -1;
    if (n.kind == NodeKind::Backward) segment = g_.node(n.forward).segment;
    else if (n.recomputes >= 0) segment = g_.node(n.recomputes).segment;
    return segment >= 0 ? fmt::format("#s{}", segment) : fmt::format("#n{}", n.id);
  }

  int slot(ValueId v, const DistAttr& d) {
    auto [it, fresh] = slots_.try_emplace(key(v, d), static_cast<int>(p_.slots.size()));
    if (fresh) {
      const Value& val = g_.value(v);
      p_.slots.push_back({val.name, val.meta, d, v});  // printed as name[dist]
    }
    return it->second;
  }
  int slot_of(ValueId v) const { return p_.value_slot[static_cast<size_t>(v)]; }

  // The slot of value v in distribution `want`, resharding from slot `from` when needed.
  int in_dist(ValueId v, int from, const DistAttr& want) {
    const Slot src = p_.slots[static_cast<size_t>(from)];  // a copy: slot() below may grow p_.slots
    if (src.dist == want) return from;
    if (auto it = slots_.find(key(v, want)); it != slots_.end()) return it->second;
    int to = slot(v, want);
    Instr r;
    r.kind = InstrKind::Reshard;
    r.in = {from};
    r.out = {to};
    r.plan = reshard::plan_reshard(src.meta.shape, src.meta.dtype, {p_.mesh, src.dist}, {p_.mesh, want}, cost_);
    p_.reshard_cost_s += r.plan.cost_s;
    p_.reshard_bytes += r.plan.bytes;
    p_.instrs.push_back(std::move(r));
    return to;
  }

  // Under regather_params: a gathered parameter the gradient kernel reads the shape of only (a bias
  // add's, an embedding's weight) is not gathered again for the backward; its slot is never
  // produced and the runtime gives the kernel a stand-in of its shape.
  bool shape_only_param(const Node& n, size_t k, ValueId v, const DistAttr& d) const {
    if (!regather_ || g_.value(v).kind != ValueKind::Param || d == c_.dist[static_cast<size_t>(v)]) return false;
    if (c_.node_inputs[static_cast<size_t>(n.id)][k] != d) return false;
    return !ops::op_registry().get(n.op).backward_reads_value(static_cast<int>(k), n.attrs);
  }

  void lower(const Node& n) {
    tag_ = regather_tag(n);
    lower_node(n);
    tag_.clear();
  }

  void lower_node(const Node& n) {
    auto ni = static_cast<size_t>(n.id);
    Instr ins;
    ins.node = n.id;
    if (n.kind == NodeKind::Fill) {
      ins.kind = InstrKind::Fill;
    } else {
      ins.kind = n.kind == NodeKind::Forward ? InstrKind::Kernel : InstrKind::Backward;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        int from = slot_of(v);
        if (n.kind == NodeKind::Backward) {
          // Forward operands and outputs: the buffers the forward kernel read and wrote.
          const Node& f = g_.node(n.forward);
          size_t nin = f.inputs.size(), nout = f.outputs.size();
          // An input is read as the forward node read it; a recompute copy (v made by apply_recompute)
          // may be laid out otherwise where no copy of f resharded it: resharded here.
          const DistAttr& d = c_.node_inputs[static_cast<size_t>(f.id)][k];
          if (k < nin && shape_only_param(n, k, v, d)) from = slot(v, d);  // never produced: a stand-in
          else if (k < nin && slots_.contains(key(v, d))) from = slot(v, d);
          else if (k < nin) from = from < 0 ? -1 : in_dist(v, from, d);
          else if (k < nin + nout) from = slot(v, c_.node_outputs[static_cast<size_t>(f.id)][k - nin]);
        }
        SW_CHECK(from >= 0, "internal: node {} reads '{}' before it is produced", n.to_string(g_), g_.value(v).name);
        ins.in.push_back(in_dist(v, from, c_.node_inputs[ni][k]));
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId o = n.outputs[k];
      ins.out.push_back(o < 0 ? -1 : slot(o, c_.node_outputs[ni][k]));
    }
    std::vector<int> outs = ins.out;
    p_.instrs.push_back(std::move(ins));
    for (size_t k = 0; k < outs.size(); ++k) {
      ValueId o = n.outputs[k];
      if (o < 0) continue;
      // An annotated output that the rule lays out differently is resharded right away.
      p_.value_slot[static_cast<size_t>(o)] = in_dist(o, outs[k], c_.dist[static_cast<size_t>(o)]);
    }
  }

  const Graph& g_;
  const Completion& c_;
  const reshard::CostModel& cost_;
  const std::vector<NodeId>& order_;
  std::vector<int> partial_dims_;
  bool regather_ = false;
  std::string tag_;  // the node being lowered's regather tag
  Program p_;
  std::map<std::string, int> slots_;
};

}  // namespace

Program lower(const Graph& g, const Completion& c, const reshard::CostModel& cost, const std::vector<NodeId>& order) {
  return Lowerer(g, c, LowerOptions{cost, order, {}, false}).run();
}
Program lower(const Graph& g, const Completion& c, const LowerOptions& options) { return Lowerer(g, c, options).run(); }

std::vector<std::pair<std::string, int>> Program::collective_counts() const {
  std::map<std::string, int> counts;
  for (const Instr& i : instrs) {
    if (i.kind != InstrKind::Reshard) continue;
    for (const reshard::Step& s : i.plan.steps) {
      if (s.kind == reshard::StepKind::LocalSlice || s.kind == reshard::StepKind::Partialize) continue;
      ++counts[std::string(reshard::step_kind_name(s.kind))];
    }
  }
  return {counts.begin(), counts.end()};
}

std::string Program::to_string(const Graph& g) const {
  std::string out = fmt::format("program on mesh {}: {} instructions\n", mesh.to_string(), instrs.size());
  auto slot_text = [&](int s) {
    if (s < 0) return std::string("_");
    return fmt::format("{}[{}]", slots[static_cast<size_t>(s)].name, slots[static_cast<size_t>(s)].dist.to_string());
  };
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instr& ins = instrs[i];
    std::vector<std::string> ins_text, outs_text;
    for (int s : ins.in) ins_text.push_back(slot_text(s));
    for (int s : ins.out) outs_text.push_back(slot_text(s));
    if (ins.kind == InstrKind::Reshard) {
      out += fmt::format("{:4}  reshard {} -> [{}]: {} B, {:.3g} us\n", i, slot_text(ins.in[0]),
                         slots[static_cast<size_t>(ins.out[0])].dist.to_string(), ins.plan.bytes, ins.plan.cost_s * 1e6);
      for (const reshard::Step& s : ins.plan.steps) out += fmt::format("          {}\n", s.to_string());
      continue;
    }
    const Node& n = g.node(ins.node);
    std::string call = ins.kind == InstrKind::Backward ? "grad_" + n.op : n.recomputes >= 0 ? "recompute_" + n.op : n.op;
    out += fmt::format("{:4}  {} = {}({})\n", i, fmt::join(outs_text, ", "), call, fmt::join(ins_text, ", "));
  }
  out += fmt::format("reshards: {:.3g} us estimated, {} B sent by the busiest rank; collectives:", reshard_cost_s * 1e6,
                     reshard_bytes);
  for (auto& [kind, count] : collective_counts()) out += fmt::format(" {} x{}", kind, count);
  return out + "\n";
}

}  // namespace shardwise::graph
