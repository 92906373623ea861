#include "shardwise/plan/program_time.h"

#include <algorithm>
#include <optional>

#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/matmul/kernels.h"
#include "shardwise/ops/softmax/lm_head.h"
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

// The ring collective a reshard step is (a redistribute is none of them).
std::optional<CollectiveKind> collective_of(reshard::StepKind kind) {
  switch (kind) {
    case reshard::StepKind::AllReduce: return CollectiveKind::AllReduce;
    case reshard::StepKind::AllGather: return CollectiveKind::AllGather;
    case reshard::StepKind::ReduceScatter: return CollectiveKind::ReduceScatter;
    case reshard::StepKind::AllToAll: return CollectiveKind::AllToAll;
    case reshard::StepKind::SendRecv: return CollectiveKind::SendRecv;
    default: return std::nullopt;
  }
}

// A reshard's collective steps on their groups' links; with a calibration's "reshard" fit, the
// instruction's seconds fitted (plan/cost.h fitted_seconds) and shared among its steps' kinds.
void add_reshard(const graph::Program& p, const graph::Instr& ins, int64_t process, const ClusterSpec& c, ProgramTime& t) {
  std::map<std::string, double> kinds;
  double total = 0;
  for (const reshard::Step& st : ins.plan.steps) {
    if (st.mesh_dim < 0 && st.kind != reshard::StepKind::Redistribute) continue;  // local slices
    if (st.kind == reshard::StepKind::Partialize) continue;
    std::vector<int> group = step_group(p, st, process);
    if (group.size() < 2) continue;
    const std::optional<CollectiveKind> kind = collective_of(st.kind);
    const LinkSpec link = group_link(c, group);
    const int k = static_cast<int>(group.size());
    // st.bytes: what the busiest rank sends; the measured collectives are timed by each rank's buffer
    const double sec = kind ? group_collective_seconds(c, *kind, static_cast<double>(st.bytes) / ring_share(*kind, k), group)
                            : latency_steps(st.kind, k) * link.latency + static_cast<double>(st.bytes) / link.bandwidth;
    kinds[std::string(reshard::step_kind_name(st.kind))] += sec;
    total += sec;
  }
  if (kinds.empty()) return;  // local only: no collective
  const double fitted = fitted_seconds(c, "reshard", total);
  for (const auto& [kind, sec] : kinds)
    t.collective_s[kind] += total > 0 ? sec * fitted / total : fitted / static_cast<double>(kinds.size());
  t.by_op["reshard"] += fitted;
  t.count_by_op["reshard"] += 1;
}

}  // namespace

HeadCollectives head_collectives(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                                 std::span<const int64_t> coords) {
  HeadCollectives h;
  const graph::Node& n = g.node(ins.node);
  if (n.op != "vocab_parallel_lm_head_cross_entropy" || ins.in.size() < 2 || ins.in[0] < 0 || ins.in[1] < 0) return h;
  if (ins.kind != graph::InstrKind::Kernel && ins.kind != graph::InstrKind::Backward) return h;
  const mesh::DistAttr& w = p.slots[static_cast<size_t>(ins.in[1])].dist;
  for (int d = 0; d < w.mesh_ndim(); ++d)
    if (w[d].is_shard() && w[d].dim == 0) h.mesh_dims.push_back(d);
  if (h.mesh_dims.empty()) return h;
  const Shape x = local(p, ins.in[0], coords), wl = local(p, ins.in[1], coords);
  const int64_t hidden = wl[wl.ndim() - 1], v_local = wl.numel() / std::max<int64_t>(hidden, 1);
  const int64_t rows = x.numel() / std::max<int64_t>(hidden, 1);
  const int64_t chunk = ops::lm_head_chunk_rows(v_local, DType::F32, n.attrs.get_int("chunk_bytes", ops::kLmHeadChunkBytes));
  const int64_t bits = n.attrs.get_int("forward_grads", 0);
  const bool forward = ins.kind == graph::InstrKind::Kernel;
  if (!forward && bits == (ops::kLmHeadGradH | ops::kLmHeadGradW)) return h;  // the forward formed both gradients
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const double rc = static_cast<double>(std::min(chunk, rows - r0));
    h.bytes.push_back(8 * rc);                   // the rows' max
    h.bytes.push_back((forward ? 16 : 8) * rc);  // their sum of exponentials (and the forward's target logit)
  }
  return h;
}

double ProgramTime::collectives() const {
  double s = 0;
  for (const auto& [kind, t] : collective_s) s += t;
  return s;
}

namespace {

// Causal flash attention over q [.., S, D] (every query head's rows): the tiles on and below the
// diagonal, half of q k^T and p v's 4 S^2 D a head: 2 S^2 D; the backward recomputes the scores and
// forms dv, dp, dq and dk: 5 of the forward's 2 products, 2.5 times the forward.
InstrWork attention_work(const graph::Program& p, const graph::Instr& ins, std::span<const int64_t> coords) {
  const Shape q = local(p, ins.in[0], coords);
  const int64_t S = q[q.ndim() - 2], D = q[q.ndim() - 1];
  const double forward = 2.0 * static_cast<double>(q.numel()) * static_cast<double>(S);
  return {ins.kind == graph::InstrKind::Backward ? 2.5 * forward : forward, S, S, D};  // q k^T: S x D by D x S
}

// The fused head over x [.., h] and the (local) weight [V, h]: one GEMM of 2 N h V for the logits and
// one for each gradient; those `forward_grads` names come out of the forward, the backward computes
// the logits again and the others.
InstrWork lm_head_work(const graph::Node& n, const graph::Program& p, const graph::Instr& ins,
                       std::span<const int64_t> coords) {
  const Shape x = local(p, ins.in[0], coords), w = local(p, ins.in[1], coords);
  const int64_t h = w[w.ndim() - 1], V = w.numel() / h, N = x.numel() / h;
  const double gemm = 2.0 * static_cast<double>(N) * static_cast<double>(h) * static_cast<double>(V);
  const int64_t bits = n.attrs.get_int("forward_grads", 0);
  const int in_forward = static_cast<int>((bits & 1) + ((bits >> 1) & 1));
  const int gemms = ins.kind != graph::InstrKind::Backward ? 1 + in_forward : in_forward == 2 ? 0 : 3 - in_forward;
  return {gemm * gemms, N, V, h};
}

// The MoE MLP over tokens x [N, H] and this rank's experts w1, w3 [E, I, H], w2 [E, H, I], top_k
// experts a token: with balanced routing a rank's experts take as many rows as its tokens send
// (N top_k), each through three GEMMs of 2 H I (w1 and w3 up, w2 down), plus the router's 2 N E_all H
// (counted with the local experts' E: a lower bound under ep); the backward twice that (both operand
// gradients). Timed at the GEMM shape of one expert's rows: N top_k / E x H by H x I.
InstrWork moe_work(const graph::Node& n, const graph::Program& p, const graph::Instr& ins, std::span<const int64_t> coords) {
  const Shape x = local(p, ins.in[0], coords), w1 = local(p, ins.in[2], coords);
  if (x.ndim() != 2 || w1.ndim() != 3) return {};
  const int64_t N = x[0], H = x[1], E = w1[0], I = w1[1], k = n.attrs.get_int("top_k", 1);
  const double rows = static_cast<double>(N * k);
  const double forward = rows * 3 * 2.0 * static_cast<double>(H * I) + 2.0 * static_cast<double>(N * E * H);
  return {ins.kind == graph::InstrKind::Backward ? 2 * forward : forward, std::max<int64_t>(1, N * k / std::max<int64_t>(E, 1)), I, H};
}

}  // namespace

InstrWork instr_work(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                     std::span<const int64_t> coords) {
  if (ins.kind != graph::InstrKind::Kernel && ins.kind != graph::InstrKind::Backward) return {};
  const graph::Node& n = g.node(ins.node);
  if (ins.in.size() < 2 || ins.in[0] < 0 || ins.in[1] < 0) return {};
  if (n.op == "flash_attention" || n.op == "flash_attention_docs") return attention_work(p, ins, coords);
  if (n.op == "lm_head_cross_entropy" || n.op == "vocab_parallel_lm_head_cross_entropy") return lm_head_work(n, p, ins, coords);
  if (n.op == "moe_mlp") return moe_work(n, p, ins, coords);
  if (n.op != "matmul") return {};
  const graph::Node& fwd = ins.kind == graph::InstrKind::Backward ? g.node(n.forward) : n;
  ops::MatmulDims d = ops::matmul_dims(local(p, ins.in[0], coords), local(p, ins.in[1], coords),
                                       fwd.attrs.get_bool("trans_x", false), fwd.attrs.get_bool("trans_y", false));
  const double flops = 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k) *
                       static_cast<double>(d.batch.numel());
  return {ins.kind == graph::InstrKind::Backward ? 2 * flops : flops, d.m, d.n, d.k};
}

double instr_flops(const graph::Graph& g, const graph::Program& p, const graph::Instr& ins,
                   std::span<const int64_t> coords) {
  return instr_work(g, p, ins, coords).flops;
}

namespace {

// Seconds of the head's own all-reduces on its vocab group's link, each its ring time.
double head_collective_seconds(const HeadCollectives& h, const graph::Program& p, int64_t process, const ClusterSpec& c) {
  if (h.bytes.empty()) return 0;
  std::vector<int64_t> members = p.mesh.processes_along(process, std::span<const int>(h.mesh_dims));
  if (members.size() < 2) return 0;
  const std::vector<int> group(members.begin(), members.end());
  double sec = 0;
  for (double b : h.bytes) sec += group_collective_seconds(c, CollectiveKind::AllReduce, b, group);
  return sec;
}

}  // namespace

ProgramTime program_time(const graph::Graph& g, const graph::Program& p, int64_t process, const ClusterSpec& c,
                         const std::string& dtype, std::span<const int> order) {
  ProgramTime t;
  const auto coords = p.mesh.coords(p.mesh.rank_index_of_process(process));
  std::vector<int> all;
  if (order.empty()) {
    for (size_t i = 0; i < p.instrs.size(); ++i) all.push_back(static_cast<int>(i));
    order = all;
  }
  // Every core holds a rank: each type's kernels slow down by the calibration's busy scale.
  const bool all_cores_busy = c.cores > 0 && p.mesh.size() >= c.cores;
  for (int i : order) {
    const graph::Instr& ins = p.instrs[static_cast<size_t>(i)];
    if (ins.kind == graph::InstrKind::Reshard) {
      add_reshard(p, ins, process, c, t);
      continue;
    }
    const std::string& op = g.node(ins.node).op;
    // The reshape family's kernels are views of their operand's storage (their gradients of the
    // incoming gradient's, ops/shape): no bytes move.
    if (op == "reshape" || op == "squeeze" || op == "unsqueeze" || op == "flatten") continue;
    double bytes = 0;
    if (ins.kind != graph::InstrKind::Fill)
      for (int s : ins.in) bytes += slot_bytes(p, s, coords);
    for (int s : ins.out) bytes += slot_bytes(p, s, coords);
    const InstrWork w = instr_work(g, p, ins, coords);
    t.flops += w.flops;
    const std::string type = ins.kind == graph::InstrKind::Fill ? "fill" : ins.kind == graph::InstrKind::Backward ? op + "_grad" : op;
    // A GEMM runs at its operands' rate (cost.h: gemm_rate_dtype).
    const bool bf16_operands = !ins.in.empty() && ins.in[0] >= 0 && p.slots[static_cast<size_t>(ins.in[0])].meta.dtype == DType::BF16;
    const std::string gemm = gemm_rate_dtype(bf16_operands, dtype);
    const double kernel = std::max(w.flops > 0 ? gemm_seconds(c, w.flops, gemm, w.m, w.n, w.k) : 0.0, memory_seconds(c, bytes));
    // An instruction's own collectives (the vocab-parallel head's) are part of its time, fitted with
    // it, and shown as all_reduce.
    const double inside = head_collective_seconds(head_collectives(g, p, ins, coords), p, process, c);
    double busy = 1.0;
    if (auto it = c.busy_kernel_scales.find(type); all_cores_busy && it != c.busy_kernel_scales.end()) busy = it->second;
    const double sec = fitted_seconds(c, type, kernel + inside) * busy;
    const double collective = inside > 0 ? sec * inside / (kernel + inside) : 0.0;
    if (collective > 0) t.collective_s["all_reduce"] += collective;
    t.compute_s += sec - collective;
    t.by_op[type] += sec;
    t.count_by_op[type] += 1;
  }
  return t;
}

}  // namespace shardwise::plan
