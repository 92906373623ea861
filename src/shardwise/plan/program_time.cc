#include "shardwise/plan/program_time.h"

#include <algorithm>

#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/matmul/kernels.h"
#include "shardwise/plan/cost.h"

namespace shardwise::plan {

namespace {

Shape local(const graph::Program& p, int slot, std::span<const int64_t> coords) {
  const graph::Slot& s = p.slots[static_cast<size_t>(slot)];
  return mesh::local_shape(s.meta.shape, s.dist, p.mesh, coords);
}

double slot_bytes(const graph::Program& p, int slot, std::span<const int64_t> coords) {
  if (slot < 0) return 0;
  const graph::Slot& s = p.slots[static_cast<size_t>(slot)];
  return static_cast<double>(local(p, slot, coords).numel()) * static_cast<double>(dtype_size(s.meta.dtype));
}

// The ranks of the group a step runs in, as global ranks.
std::vector<int> step_group(const graph::Program& p, const reshard::Step& st, int64_t process) {
  std::vector<int64_t> members = st.kind == reshard::StepKind::Redistribute
                                     ? p.mesh.processes_along(process, std::span<const int>(st.group_dims))
                                     : p.mesh.processes_along(process, st.mesh_dim);
  return std::vector<int>(members.begin(), members.end());
}

// Latency steps of a reshard step over k ranks (the reshard planner's count).
double latency_steps(reshard::StepKind kind, double k) {
  switch (kind) {
    case reshard::StepKind::AllReduce: return 2 * (k - 1);
    case reshard::StepKind::SendRecv: return 1;
    default: return k - 1;
  }
}

}  // namespace

double ProgramTime::collectives() const {
  double s = 0;
  for (const auto& [kind, t] : collective_s) s += t;
  return s;
}

double instr_flops(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                   std::span<const int64_t> coords) {
  if (ins.kind != graph::InstrKind::Kernel && ins.kind != graph::InstrKind::Backward) return 0;
  const graph::Node& n = g.node(ins.node);
  if (n.op != "matmul" || ins.in.size() < 2 || ins.in[0] < 0 || ins.in[1] < 0) return 0;
  const graph::Node& fwd = ins.kind == graph::InstrKind::Backward ? g.node(n.forward) : n;
  ops::MatmulDims d = ops::matmul_dims(local(p, ins.in[0], coords), local(p, ins.in[1], coords),
                                       fwd.attrs.get_bool("trans_x", false), fwd.attrs.get_bool("trans_y", false));
  const double flops = 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k) *
                       static_cast<double>(d.batch.numel());
  return ins.kind == graph::InstrKind::Backward ? 2 * flops : flops;
}

ProgramTime program_time(const graph::Graph& g, const graph::Program& p, int64_t process, const ClusterSpec& c,
                         const std::string& dtype, std::span<const int> order) {
  ProgramTime t;
  const auto coords = p.mesh.coords(p.mesh.rank_index_of_process(process));
  std::vector<int> all;
  if (order.empty()) {
    for (size_t i = 0; i < p.instrs.size(); ++i) all.push_back(static_cast<int>(i));
    order = all;
  }
  for (int i : order) {
    const graph::Instr& ins = p.instrs[static_cast<size_t>(i)];
    if (ins.kind == graph::InstrKind::Reshard) {
      for (const reshard::Step& st : ins.plan.steps) {
        if (st.mesh_dim < 0 && st.kind != reshard::StepKind::Redistribute) continue;  // local slices
        if (st.kind == reshard::StepKind::Partialize) continue;
        std::vector<int> group = step_group(p, st, process);
        if (group.size() < 2) continue;
        LinkSpec link = group_link(c, group);
        t.collective_s[std::string(reshard::step_kind_name(st.kind))] +=
            latency_steps(st.kind, static_cast<double>(group.size())) * link.latency +
            static_cast<double>(st.bytes) / link.bandwidth;
      }
      continue;
    }
    double bytes = 0;
    if (ins.kind != graph::InstrKind::Fill)
      for (int s : ins.in) bytes += slot_bytes(p, s, coords);
    for (int s : ins.out) bytes += slot_bytes(p, s, coords);
    const double flops = instr_flops(g, p, ins, coords);
    t.flops += flops;
    t.compute_s += std::max(flops > 0 ? compute_seconds(c, flops, dtype) : 0.0, memory_seconds(c, bytes));
  }
  return t;
}

}  // namespace shardwise::plan
