#include "shardwise/pipeline/stage.h"

#include <algorithm>

#include "shardwise/core/error.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/recompute.h"

namespace shardwise::pipeline {
namespace {

enum Phase : int { kForward = 0, kBackward = 1 };

// Instruction phases: forward or backward by node; a reshard runs with its earliest consumer
// (or, read by nobody, with what produced its input).
std::vector<int> phases(const graph::Graph& g, const graph::Program& p, int forward_nodes,
                        std::vector<int>& producer) {
  const size_t n = p.instrs.size();
  producer.assign(p.slots.size(), -1);
  for (size_t i = 0; i < n; ++i)
    for (int s : p.instrs[i].out)
      if (s >= 0) producer[static_cast<size_t>(s)] = static_cast<int>(i);
  std::vector<int> phase(n, kBackward);
  for (size_t i = 0; i < n; ++i) {
    const graph::Instr& ins = p.instrs[i];
    if (ins.kind != graph::InstrKind::Reshard) phase[i] = ins.node < forward_nodes ? kForward : kBackward;
  }
  // Reshards: consumers come later in program order, so walk backwards.
  std::vector<int> earliest_consumer(p.slots.size(), kBackward + 1);
  for (size_t i = n; i-- > 0;) {
    const graph::Instr& ins = p.instrs[i];
    if (ins.kind == graph::InstrKind::Reshard) {
      int out = earliest_consumer[static_cast<size_t>(ins.out[0])];
      int from = producer[static_cast<size_t>(ins.in[0])];
      phase[i] = out <= kBackward ? out : (from < 0 ? kForward : phase[static_cast<size_t>(from)]);
    }
    for (int s : ins.in)
      if (s >= 0) earliest_consumer[static_cast<size_t>(s)] = std::min(earliest_consumer[static_cast<size_t>(s)], phase[i]);
  }
  (void)g;
  return phase;
}

int mesh_dim_named(const mesh::ProcessMesh& mesh, const std::string& dim, int stage, const char* what) {
  const std::vector<std::string>& names = mesh.dim_names();
  auto it = std::find(names.begin(), names.end(), dim);
  SW_CHECK(it != names.end(), "stage {}: no mesh dim '{}' to {} (mesh {})", stage, dim, what, mesh.to_string());
  return static_cast<int>(it - names.begin());
}

}  // namespace

CompiledStage compile_stage(StageSpec& spec, const mesh::ProcessMesh& mesh, bool split) {
  graph::Graph& g = *spec.graph;
  CompiledStage out;
  out.forward_nodes = static_cast<int>(g.nodes().size());
  const bool last = spec.output.empty();
  if (spec.training) {
    graph::AutodiffOptions options;
    options.split_param_grads = split;
    graph::ValueId target = g.get(last ? spec.loss : spec.output);
    if (!last) options.seed = g.get(spec.output_grad);
    if (!spec.extra_loss.empty()) options.extra_losses.push_back(g.get(spec.extra_loss));
    graph::append_backward(g, target, options);
    if (!spec.input.empty()) {
      const graph::Value& in = g.value(g.get(spec.input));
      SW_CHECK(in.grad >= 0, "stage {}: the input '{}' takes no gradient (mark it requires_grad before building)",
               spec.stage, spec.input);
      SW_CHECK(in.annotation.has_value() && !in.annotation->has_partial(),
               "stage {}: the input '{}' needs a Shard/Replicate annotation (both stages must agree on its layout)",
               spec.stage, spec.input);
      out.input_grad = g.value(in.grad).name;
      g.annotate(in.grad, *in.annotation);
    }
  }
  graph::Completion completion = graph::complete(g, mesh);
  graph::LowerOptions lower;
  for (const std::string& dim : spec.shard_params_dims) {
    graph::shard_params_over(g, completion, mesh_dim_named(mesh, dim, spec.stage, "store parameters sharded over"));
    lower.regather_params = true;
  }
  if (spec.training) lower.order = graph::apply_recompute(g, completion).order;  // no-op without segments
  for (const std::string& dim : spec.partial_grad_dims)
    lower.partial_grad_dims.push_back(mesh_dim_named(mesh, dim, spec.stage, "leave parameter gradients Partial on"));
  out.program = graph::lower(g, completion, lower);
  const graph::Program& p = out.program;
  std::vector<int> producer;
  std::vector<int> phase = phases(g, p, out.forward_nodes, producer);
  // What the runner reads after the forward phase (the output it sends on, the loss, the result)
  // is made in it: an annotated value the rule lays out otherwise is resharded into its slot, and
  // that reshard must not wait for a backward consumer of the same layout (a residual stream whose
  // add yields P(sum) on tp, annotated R at the stage boundary, read R by the add's gradient).
  std::vector<const std::string*> read = {&spec.output, &spec.loss, &spec.extra_loss};
  for (const std::string& name : spec.results) read.push_back(&name);
  for (const std::string& name : spec.stats) read.push_back(&name);
  for (const std::string* name : read) {
    if (name->empty()) continue;
    int i = producer[static_cast<size_t>(p.value_slot[static_cast<size_t>(g.get(*name))])];
    while (i >= 0 && phase[static_cast<size_t>(i)] != kForward &&
           p.instrs[static_cast<size_t>(i)].kind == graph::InstrKind::Reshard) {
      phase[static_cast<size_t>(i)] = kForward;
      i = producer[static_cast<size_t>(p.instrs[static_cast<size_t>(i)].in[0])];
    }
  }
  // The input-gradient phase: the backward instructions the input's gradient depends on.
  std::vector<bool> needed(p.instrs.size(), false);
  if (!out.input_grad.empty()) {
    std::vector<int> stack = {producer[static_cast<size_t>(p.value_slot[static_cast<size_t>(g.get(out.input_grad))])]};
    while (!stack.empty()) {
      int i = stack.back();
      stack.pop_back();
      if (i < 0 || phase[static_cast<size_t>(i)] == kForward || needed[static_cast<size_t>(i)]) continue;
      needed[static_cast<size_t>(i)] = true;
      for (int s : p.instrs[static_cast<size_t>(i)].in)
        if (s >= 0) stack.push_back(producer[static_cast<size_t>(s)]);
    }
  }
  for (size_t i = 0; i < p.instrs.size(); ++i)
    if (phase[i] == kForward) out.order.push_back(static_cast<int>(i));
  out.forward_end = out.order.size();
  for (size_t i = 0; i < p.instrs.size(); ++i)
    if (phase[i] != kForward && (needed[i] || !split)) out.order.push_back(static_cast<int>(i));
  out.input_grad_end = out.order.size();
  for (size_t i = 0; i < p.instrs.size(); ++i)
    if (phase[i] != kForward && !needed[i] && split) out.order.push_back(static_cast<int>(i));
  if (!split) out.input_grad_end = out.order.size();
  return out;
}

mesh::ProcessMesh stage_mesh(const mesh::ProcessMesh& m, int pp_dim, int64_t coord, const std::string& single_name) {
  SW_CHECK(pp_dim >= 0 && pp_dim < m.ndim(), "stage_mesh: mesh {} has no dim {}", m.to_string(), pp_dim);
  SW_CHECK(coord >= 0 && coord < m.dim_size(pp_dim), "stage_mesh: coordinate {} outside dim {} of size {}", coord,
           pp_dim, m.dim_size(pp_dim));
  Shape shape;
  std::vector<std::string> names;
  for (int d = 0; d < m.ndim(); ++d) {
    if (d == pp_dim) continue;
    shape.push_back(m.dim_size(d));
    if (!m.dim_names().empty()) names.push_back(m.dim_names()[static_cast<size_t>(d)]);
  }
  std::vector<int64_t> processes;
  for (int64_t r = 0; r < m.size(); ++r) {
    if (m.coords(r)[static_cast<size_t>(pp_dim)] == coord) processes.push_back(m.process_ids()[static_cast<size_t>(r)]);
  }
  if (shape.ndim() == 0) return mesh::ProcessMesh(Shape{1}, processes, {single_name});
  return mesh::ProcessMesh(shape, processes, names);
}

}  // namespace shardwise::pipeline
