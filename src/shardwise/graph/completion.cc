#include "shardwise/graph/completion.h"

#include <map>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::graph {
namespace {

using mesh::DistAttr;

const spmd::Rule& rule_of(const Node& n) {
  return ops::op_registry().get(n.op).rule;
}

std::string dists(const std::vector<DistAttr>& ds) {
  std::vector<std::string> s;
  for (const DistAttr& d : ds) s.push_back("[" + d.to_string() + "]");
  return fmt::format("{}", fmt::join(s, " "));
}

class Completer {
 public:
  Completer(const Graph& g, const mesh::ProcessMesh& mesh, const CompletionOptions& o) : g_(g), mesh_(mesh), o_(o) {
    const size_t nv = g.values().size();
    for (const Value& v : g.values()) {
      if (v.annotation) {
        SW_CHECK(v.annotation->mesh_ndim() == mesh.ndim(), "the annotation [{}] of '{}' has {} mesh dims but mesh {} has {}",
                 v.annotation->to_string(), v.name, v.annotation->mesh_ndim(), mesh.to_string(), mesh.ndim());
        v.annotation->validate(v.meta.shape.ndim(), mesh.ndim(), fmt::format("the annotation of '{}'", v.name));
      }
    }
    hint_.assign(nv, std::nullopt);
    hint_why_.assign(nv, "");
    chosen_.assign(nv, std::nullopt);
  }

  Completion run() {
    reverse_pass();
    Completion c;
    for (int pass = 1;; ++pass) {
      c = forward_pass();
      c.passes = pass;
      if (pass >= o_.max_passes || !refine_leaves(c)) break;
    }
    return c;
  }

 private:
  bool is_leaf(const Value& v) const { return v.producer < 0; }

  // Reverse rules from annotated activations towards the unannotated leaves.
  void reverse_pass() {
    for (size_t i = g_.nodes().size(); i-- > 0;) {
      const Node& n = g_.nodes()[i];
      if (n.kind != NodeKind::Forward) continue;
      bool any_known = false;
      std::vector<spmd::TensorSpec> outs, ins;
      for (ValueId o : n.outputs) {
        const Value& v = g_.value(o);
        std::optional<DistAttr> d = v.annotation ? v.annotation : hint_[static_cast<size_t>(o)];
        any_known = any_known || d.has_value();
        outs.push_back({v.meta.shape, v.meta.dtype, d.value_or(DistAttr(mesh_.ndim()))});
      }
      if (!any_known) continue;
      for (ValueId in : n.inputs) {
        const Value& v = g_.value(in);
        ins.push_back({v.meta.shape, v.meta.dtype, v.annotation.value_or(hint_[static_cast<size_t>(in)].value_or(DistAttr(mesh_.ndim())))});
      }
      spmd::SpmdResult r = rule_of(n).reverse(mesh_, ins, outs, n.attrs);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId in = n.inputs[k];
        const Value& v = g_.value(in);
        if (v.annotation || hint_[static_cast<size_t>(in)]) continue;
        hint_[static_cast<size_t>(in)] = r.inputs[k];
        hint_why_[static_cast<size_t>(in)] =
            fmt::format("suggested by the reverse rule '{}' of node {} from its outputs {}", rule_of(n).name,
                        n.to_string(g_), dists([&] {
                          std::vector<DistAttr> o;
                          for (auto& s : outs) o.push_back(s.dist);
                          return o;
                        }()));
      }
    }
  }

  Completion forward_pass() {
    Completion c;
    c.mesh = mesh_;
    const size_t nv = g_.values().size();
    c.dist.assign(nv, DistAttr(mesh_.ndim()));
    c.why.assign(nv, "");
    std::vector<bool> known(nv, false);
    consumers_.assign(nv, {});
    for (const Value& v : g_.values()) {
      auto i = static_cast<size_t>(v.id);
      if (v.annotation) {
        c.dist[i] = *v.annotation, known[i] = true, c.why[i] = "annotated by the user";
      } else if (is_leaf(v) && chosen_[i]) {
        c.dist[i] = *chosen_[i], known[i] = true, c.why[i] = chosen_why_[i];
      } else if (is_leaf(v) && hint_[i]) {
        c.dist[i] = *hint_[i], c.why[i] = hint_why_[i];
      } else if (is_leaf(v)) {
        c.why[i] = "default for an unannotated input or parameter: Replicate";
      }
    }
    c.node_inputs.resize(g_.nodes().size());
    c.node_outputs.resize(g_.nodes().size());
    for (const Node& n : g_.nodes()) {
      auto ni = static_cast<size_t>(n.id);
      if (n.kind == NodeKind::Fill) {
        for (ValueId o : n.outputs) {
          c.dist[static_cast<size_t>(o)] = DistAttr(mesh_.ndim());
          c.why[static_cast<size_t>(o)] = "a constant fill: Replicate (consumers slice or partialize it for free)";
          c.node_outputs[ni].push_back(DistAttr(mesh_.ndim()));
        }
        continue;
      }
      // Operands as the kernel would see them without reshards.
      std::vector<spmd::TensorSpec> specs;
      std::vector<ValueId> operands = n.inputs;
      for (size_t k = 0; k < operands.size(); ++k) {
        const Value& v = g_.value(operands[k]);
        DistAttr d = c.dist[static_cast<size_t>(operands[k])];
        if (n.kind == NodeKind::Backward) {
          // The forward node's operands and outputs, as its kernel saw and wrote them.
          auto fi = static_cast<size_t>(n.forward);
          size_t nin = g_.node(n.forward).inputs.size(), nout = g_.node(n.forward).outputs.size();
          if (k < nin) d = c.node_inputs[fi][k];
          else if (k < nin + nout) d = c.node_outputs[fi][k - nin];
        }
        specs.push_back({v.meta.shape, v.meta.dtype, d});
      }
      const spmd::Rule& rule = rule_of(n);
      spmd::SpmdResult r;
      try {
        r = n.kind == NodeKind::Forward ? rule.forward(mesh_, specs, n.attrs) : rule.grad(mesh_, specs, n.attrs);
      } catch (const Error& e) {
        fail("node {}: the {} rule '{}' failed on {}: {}", n.to_string(g_), n.kind == NodeKind::Forward ? "forward" : "grad",
             rule.name, dists([&] {
               std::vector<DistAttr> d;
               for (auto& s : specs) d.push_back(s.dist);
               return d;
             }()), e.what());
      }
      SW_CHECK(r.inputs.size() == specs.size(), "internal: rule '{}' returned {} input distributions for {} operands",
               rule.name, r.inputs.size(), specs.size());
      for (size_t k = 0; k < operands.size(); ++k) {
        auto vi = static_cast<size_t>(operands[k]);
        const Value& v = g_.value(operands[k]);
        if (n.kind == NodeKind::Forward) consumers_[vi].push_back({n.id, r.inputs[k]});
        if (is_leaf(v) && !known[vi]) {
          c.dist[vi] = r.inputs[k];
          known[vi] = true;
          c.why[vi] = fmt::format("required by its first consumer, node {} (rule '{}', operands {})", n.to_string(g_),
                                  rule.name, dists([&] {
                                    std::vector<DistAttr> d;
                                    for (auto& s : specs) d.push_back(s.dist);
                                    return d;
                                  }()));
        }
      }
      c.node_inputs[ni] = r.inputs;
      // Backward nodes: the kernel reads the forward operands in the required layout as well.
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        ValueId o = n.outputs[k];
        DistAttr claimed = k < r.outputs.size() ? r.outputs[k] : DistAttr(mesh_.ndim());
        c.node_outputs[ni].push_back(claimed);
        if (o < 0) continue;
        auto oi = static_cast<size_t>(o);
        const Value& v = g_.value(o);
        known[oi] = true;
        if (v.annotation) continue;
        c.dist[oi] = claimed;
        c.why[oi] = fmt::format("output {} of node {} by the {} rule '{}' from operands {}", k, n.to_string(g_),
                                n.kind == NodeKind::Forward ? "forward" : "grad", rule.name, dists(r.inputs));
      }
    }
    return c;
  }

  // Step 4: a leaf read under different distributions takes the cheapest one. True if one changed.
  bool refine_leaves(const Completion& c) {
    bool changed = false;
    for (const Value& v : g_.values()) {
      auto i = static_cast<size_t>(v.id);
      if (!is_leaf(v) || v.annotation || consumers_[i].size() < 2) continue;
      std::vector<DistAttr> candidates;
      for (auto& [node, d] : consumers_[i]) {
        if (std::find(candidates.begin(), candidates.end(), d) == candidates.end()) candidates.push_back(d);
      }
      if (candidates.size() < 2) continue;
      auto cost_of = [&](const DistAttr& from) {
        double total = 0;
        for (auto& [node, d] : consumers_[i]) {
          total += reshard::plan_reshard(v.meta.shape, v.meta.dtype, {mesh_, from}, {mesh_, d}, o_.cost).cost_s;
        }
        return total;
      };
      const DistAttr* best = &c.dist[i];
      double best_cost = cost_of(*best);
      for (const DistAttr& cand : candidates) {
        double cost = cost_of(cand);
        if (cost < best_cost * (1 - 1e-9)) best = &cand, best_cost = cost;
      }
      if (!(*best == c.dist[i])) {
        chosen_[i] = *best;
        chosen_why_[i] = fmt::format("the cheapest of the distributions its {} consumers require ({:.3g} us of reshards)",
                                     consumers_[i].size(), best_cost * 1e6);
        changed = true;
      }
    }
    return changed;
  }

  const Graph& g_;
  const mesh::ProcessMesh& mesh_;
  const CompletionOptions& o_;
  std::vector<std::optional<DistAttr>> hint_, chosen_;
  std::vector<std::string> hint_why_;
  std::vector<std::vector<std::pair<NodeId, DistAttr>>> consumers_;
  std::map<size_t, std::string> chosen_why_;
};

}  // namespace

Completion complete(const Graph& g, const mesh::ProcessMesh& mesh, const CompletionOptions& options) {
  return Completer(g, mesh, options).run();
}

std::string explain(const Graph& g, const Completion& c, ValueId v) {
  const Value& val = g.value(v);
  return fmt::format("{} ({} {} {}): [{}] — {}", val.name, value_kind_name(val.kind), dtype_name(val.meta.dtype),
                     val.meta.shape.to_string(), c.dist[static_cast<size_t>(v)].to_string(),
                     c.why[static_cast<size_t>(v)]);
}

int shard_params_over(const Graph& g, Completion& c, int mesh_dim) {
  SW_CHECK(mesh_dim >= 0 && mesh_dim < c.mesh.ndim(), "shard_params_over: mesh {} has no dim {}", c.mesh.to_string(),
           mesh_dim);
  int sharded = 0;
  for (ValueId p : g.params()) {
    mesh::DistAttr& d = c.dist[static_cast<size_t>(p)];
    if (g.value(p).meta.shape.ndim() == 0 || !d[mesh_dim].is_replicate()) continue;
    mesh::MeshDimList order = d.mesh_dims_of(0);
    order.push_back(mesh_dim);
    d.set_shard_order(0, order);
    c.why[static_cast<size_t>(p)] += fmt::format("; sharding stage 3: stored split over mesh dim {}", mesh_dim);
    ++sharded;
  }
  return sharded;
}

}  // namespace shardwise::graph
