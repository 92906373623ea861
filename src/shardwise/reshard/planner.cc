// The reshard planner: per-dim collectives (DTensor-style, with reduce_scatter and all_to_all where
// they apply), one redistribute (all_to_all_v of block intersections), or point-to-point between
// meshes; the cheapest under the cost model wins.
#include <algorithm>
#include <map>

#include "shardwise/core/error.h"
#include "shardwise/reshard/blocks.h"
#include "shardwise/reshard/plan.h"

namespace shardwise::reshard {
namespace {

using mesh::DistAttr;
using mesh::MeshDimList;
using mesh::Placement;
using mesh::ReduceOp;

bool linear(ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Avg; }
// Reducing over one mesh dim before another gives the same value.
bool commutes(ReduceOp a, ReduceOp b) { return a == b || (linear(a) && linear(b)); }

bool is_prefix(const MeshDimList& a, const MeshDimList& b) {
  if (a.size() > b.size()) return false;
  for (int i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

MeshDimList without_last(const MeshDimList& l) {
  MeshDimList out;
  for (int i = 0; i + 1 < l.size(); ++i) out.push_back(l[i]);
  return out;
}

MeshDimList with(const MeshDimList& l, int m) {
  MeshDimList out = l;
  out.push_back(m);
  return out;
}

// `d` with every mesh dim of size 1 made Replicate: the same block on every rank (a Partial over
// one rank is its value, reduced or not; a tensor dim split into one piece is whole).
DistAttr without_unit_dims(const mesh::ProcessMesh& mesh, const DistAttr& d) {
  DistAttr out = d;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (mesh.dim_size(m) == 1 && !d[m].is_replicate()) out.set(m, Placement::replicate());
  }
  return out;
}

// Builds a plan step by step from `from`. A step that changes the layout on mesh dims of size 1
// only (a dp = 1 gradient's P(sum) -> R, a slice over one rank) moves no data: it changes the
// current layout but is left out of the plan, so such a reshard makes no collective and no copy
// (the executor hands the input on as the output; the bits are the same).
class Builder {
 public:
  Builder(const Shape& shape, DType dtype, const Layout& from, const CostModel& cost)
      : shape_(shape), elem_(static_cast<int64_t>(dtype_size(dtype))), cur_(from), cost_(cost) {}

  const DistAttr& cur() const { return cur_.dist; }
  std::vector<Step>& steps() { return steps_; }

  void all_reduce(int m) {
    Step s = begin(StepKind::AllReduce, m);
    s.op = cur()[m].reduce;
    DistAttr next = cur();
    next.set(m, Placement::replicate());
    double k = static_cast<double>(cur_.mesh.dim_size(m));
    double bytes = 2.0 * (k - 1) / k * static_cast<double>(local_bytes());
    finish(s, next, bytes, 2.0 * (k - 1) * cost_.alpha(m));
  }

  void reduce_scatter(int m, int d) {
    Step s = begin(StepKind::ReduceScatter, m);
    s.op = cur()[m].reduce;
    s.tensor_dim = d;
    DistAttr next = cur();
    next.set(m, Placement::replicate());
    next.set_shard_order(d, with(cur().mesh_dims_of(d), m));
    double k = static_cast<double>(cur_.mesh.dim_size(m));
    finish(s, next, (k - 1) / k * static_cast<double>(local_bytes()), (k - 1) * cost_.alpha(m));
  }

  void all_gather(int m, int d) {
    Step s = begin(StepKind::AllGather, m);
    s.tensor_dim = d;
    DistAttr next = cur();
    next.set_shard_order(d, without_last(cur().mesh_dims_of(d)));
    double k = static_cast<double>(cur_.mesh.dim_size(m));
    finish(s, next, (k - 1) / k * static_cast<double>(bytes_under(next)), (k - 1) * cost_.alpha(m));
  }

  void all_to_all(int m, int d, int e) {
    Step s = begin(StepKind::AllToAll, m);
    s.tensor_dim = d;
    s.to_tensor_dim = e;
    DistAttr next = cur();
    MeshDimList e_list = with(cur().mesh_dims_of(e), m);
    next.set_shard_order(d, without_last(cur().mesh_dims_of(d)));
    next.set_shard_order(e, e_list);
    double k = static_cast<double>(cur_.mesh.dim_size(m));
    finish(s, next, (k - 1) / k * static_cast<double>(local_bytes()), (k - 1) * cost_.alpha(m));
  }

  void local_slice(const DistAttr& next) {
    Step s = begin(StepKind::LocalSlice, -1);
    finish(s, next, 0, 0);
  }

  void partialize(int m, ReduceOp op) {
    Step s = begin(StepKind::Partialize, m);
    s.op = op;
    DistAttr next = cur();
    next.set(m, Placement::partial(op));
    finish(s, next, 0, 0);
  }

  void redistribute(const DistAttr& next, std::vector<int> group_dims) {
    Step s = begin(StepKind::Redistribute, -1);
    s.group_dims = group_dims;
    Layout after{cur_.mesh, next};
    // Estimate on the group of rank 0 (the largest blocks): the busiest rank's bytes in or out.
    std::vector<int64_t> zeros(static_cast<size_t>(cur_.mesh.ndim()), 0);
    auto src = holders(shape_, cur_, zeros, group_dims), dst = holders(shape_, after, zeros, group_dims);
    std::map<int64_t, int64_t> sent, received;
    for (const Transfer& t : plan_transfers(src, dst)) {
      if (t.src == t.dst) continue;
      sent[t.src] += t.box.numel();
      received[t.dst] += t.box.numel();
    }
    int64_t busiest = 0;
    for (auto& [p, n] : sent) busiest = std::max(busiest, n);
    for (auto& [p, n] : received) busiest = std::max(busiest, n);
    double alpha = 0, bw = 1e300, k = static_cast<double>(src.size());
    for (int m : group_dims) alpha = std::max(alpha, cost_.alpha(m)), bw = std::min(bw, cost_.bandwidth(m));
    s.bytes = busiest * elem_;
    s.cost_s = (k - 1) * alpha + static_cast<double>(s.bytes) / bw;
    s.after = after;
    cur_ = after;
    if (!moves_nothing(s)) steps_.push_back(s);
  }

 private:
  Step begin(StepKind kind, int m) {
    Step s;
    s.kind = kind;
    s.mesh_dim = m;
    s.before = cur_;
    return s;
  }
  void finish(Step& s, const DistAttr& next, double bytes, double alpha_total) {
    s.after = {cur_.mesh, next};
    s.bytes = static_cast<int64_t>(bytes);
    s.cost_s = s.mesh_dim >= 0 ? alpha_total + bytes / cost_.bandwidth(s.mesh_dim) : 0;
    cur_ = s.after;
    if (!moves_nothing(s)) steps_.push_back(s);
  }
  static bool moves_nothing(const Step& s) {
    return without_unit_dims(s.before.mesh, s.before.dist) == without_unit_dims(s.after.mesh, s.after.dist);
  }
  int64_t bytes_under(const DistAttr& d) const { return max_local_numel(shape_, {cur_.mesh, d}) * elem_; }
  int64_t local_bytes() const { return bytes_under(cur_.dist); }

  Shape shape_;
  int64_t elem_;
  Layout cur_;
  const CostModel& cost_;
  std::vector<Step> steps_;
};

// Which Partial mesh dims stay Partial: the same op on both sides, and no dim reduced before them
// fails to commute with them (reductions run from the last mesh dim to the first).
std::vector<bool> kept_partials(const DistAttr& from, const DistAttr& to) {
  int n = from.mesh_ndim();
  std::vector<bool> keep(static_cast<size_t>(n));
  for (int m = 0; m < n; ++m) keep[static_cast<size_t>(m)] = from[m].is_partial() && from[m] == to[m];
  for (bool changed = true; changed;) {
    changed = false;
    for (int m = 0; m < n; ++m) {
      if (!from[m].is_partial() || keep[static_cast<size_t>(m)]) continue;
      for (int later = m + 1; later < n; ++later) {
        if (keep[static_cast<size_t>(later)] && !commutes(from[m].reduce, from[later].reduce)) {
          keep[static_cast<size_t>(later)] = false;
          changed = true;
        }
      }
    }
  }
  return keep;
}

// Phase A: reduce the Partial dims that do not stay, last mesh dim first; reduce_scatter where the
// target shards that mesh dim and it would split the tensor dim next.
void resolve_partials(Builder& b, const DistAttr& to, bool allow_reduce_scatter) {
  std::vector<bool> keep = kept_partials(b.cur(), to);
  for (int m = b.cur().mesh_ndim() - 1; m >= 0; --m) {
    if (!b.cur()[m].is_partial() || keep[static_cast<size_t>(m)]) continue;
    if (allow_reduce_scatter && to[m].is_shard()) {
      int d = to[m].dim;
      MeshDimList have = b.cur().mesh_dims_of(d), want = to.mesh_dims_of(d);
      if (is_prefix(have, want) && want.size() > have.size() && want[have.size()] == m) {
        b.reduce_scatter(m, d);
        continue;
      }
    }
    b.all_reduce(m);
  }
}

// Phase B: unshard every mesh dim that splits a tensor dim beyond what the target keeps, innermost
// first; Shard(d) -> Shard(e) on one mesh dim by all_to_all when e is ready to take it.
void unshard(Builder& b, const DistAttr& to, int ndim) {
  for (;;) {
    struct Candidate {
      int m, d;
    };
    std::vector<Candidate> removable;
    for (int d = 0; d < ndim; ++d) {
      MeshDimList have = b.cur().mesh_dims_of(d), want = to.mesh_dims_of(d);
      int common = 0;
      while (common < have.size() && common < want.size() && have[common] == want[common]) ++common;
      if (have.size() > common) removable.push_back({have[have.size() - 1], d});
    }
    if (removable.empty()) return;
    const Candidate* gather = nullptr;
    bool done = false;
    for (const Candidate& c : removable) {
      if (to[c.m].is_shard() && to[c.m].dim != c.d) {
        int e = to[c.m].dim;
        MeshDimList have_e = b.cur().mesh_dims_of(e), want_e = to.mesh_dims_of(e);
        if (is_prefix(have_e, want_e) && want_e.size() > have_e.size() && want_e[have_e.size()] == c.m) {
          b.all_to_all(c.m, c.d, e);
          done = true;
          break;
        }
        continue;  // may become an all_to_all once dim e is ready
      }
      if (!gather) gather = &c;
    }
    if (done) continue;
    if (!gather) gather = &removable.front();  // only waiting all_to_alls left: break the cycle
    b.all_gather(gather->m, gather->d);
  }
}

// Phases C and D: shard locally where the target shards more, then make the target's Partials.
void reshard_locally(Builder& b, const DistAttr& to, int ndim) {
  DistAttr sliced = b.cur();
  for (int d = 0; d < ndim; ++d) sliced.set_shard_order(d, to.mesh_dims_of(d));
  if (!(sliced == b.cur())) b.local_slice(sliced);
  for (int m = 0; m < to.mesh_ndim(); ++m) {
    if (to[m].is_partial() && !(b.cur()[m] == to[m])) b.partialize(m, to[m].reduce);
  }
}

void total(Plan& p, std::string strategy) {
  p.cost_s = 0;
  p.bytes = 0;
  for (const Step& s : p.steps) p.cost_s += s.cost_s, p.bytes += s.bytes;
  p.strategy = p.steps.empty() ? "none" : std::move(strategy);
}

// Shards locally and partializes to the target, checks the builder reached it, and totals.
Plan finish_same_mesh(Plan p, Builder& b, std::string strategy) {
  reshard_locally(b, p.to.dist, p.shape.ndim());
  SW_CHECK(b.cur() == p.to.dist, "internal: the {} plan reached {} instead of {}", strategy, b.cur().to_string(),
           p.to.dist.to_string());
  p.steps = std::move(b.steps());
  total(p, std::move(strategy));
  return p;
}

Plan collectives_plan(const Plan& base, const CostModel& cost) {
  Builder b(base.shape, base.dtype, base.from, cost);
  resolve_partials(b, base.to.dist, true);
  unshard(b, base.to.dist, base.shape.ndim());
  return finish_same_mesh(base, b, "collectives");
}

Plan redistribute_plan(const Plan& base, const CostModel& cost) {
  const Plan& p = base;
  Builder b(p.shape, p.dtype, p.from, cost);
  resolve_partials(b, p.to.dist, false);
  // The target's shards, with the Partials that stay (resolve_partials left only those: each
  // equals the target's); the target's other Partials are made after the move.
  DistAttr target = b.cur();
  for (int m = 0; m < target.mesh_ndim(); ++m) {
    if (!target[m].is_partial()) target.set(m, Placement::replicate());
  }
  for (int d = 0; d < p.shape.ndim(); ++d) target.set_shard_order(d, p.to.dist.mesh_dims_of(d));
  if (!(target == b.cur())) {
    // Group: every mesh dim except kept Partials and dims replicated on both sides.
    std::vector<int> dims;
    for (int m = 0; m < target.mesh_ndim(); ++m) {
      if (b.cur()[m].is_partial()) continue;
      if (b.cur()[m].is_replicate() && target[m].is_replicate()) continue;
      dims.push_back(m);
    }
    b.redistribute(target, dims);
  }
  return finish_same_mesh(base, b, "redistribute");
}

// Between meshes: reduce Partials on the source mesh (unless both sides are the same shape and
// placements: then rank i sends its part to rank i as it is), send blocks point to point, and make
// the target's Partials on the target mesh.
Plan send_recv_plan(const Plan& base, const CostModel& cost) {
  Plan p = base;
  bool pairwise = p.from.mesh.shape() == p.to.mesh.shape() && p.from.dist == p.to.dist;
  Builder src(p.shape, p.dtype, p.from, cost);
  if (!pairwise) {
    for (int m = p.from.mesh.ndim() - 1; m >= 0; --m) {
      if (src.cur()[m].is_partial()) src.all_reduce(m);
    }
  }
  p.steps = std::move(src.steps());
  Step s;
  s.kind = StepKind::SendRecv;
  s.before = {p.from.mesh, src.cur()};
  s.after = {p.to.mesh, pairwise ? p.to.dist : p.to.dist.without_partials()};
  // Busiest process: bytes it sends or receives from other processes; one alpha per message.
  std::map<int64_t, int64_t> traffic, messages;
  if (pairwise) {
    int64_t n = max_local_numel(p.shape, s.before);
    for (int64_t i = 0; i < p.from.mesh.size(); ++i) {
      int64_t a = p.from.mesh.process_ids()[static_cast<size_t>(i)], z = p.to.mesh.process_ids()[static_cast<size_t>(i)];
      if (a != z) traffic[a] += n, traffic[z] += n, ++messages[a], ++messages[z];
    }
  } else {
    std::vector<int> all_src(static_cast<size_t>(p.from.mesh.ndim())), all_dst(static_cast<size_t>(p.to.mesh.ndim()));
    for (size_t i = 0; i < all_src.size(); ++i) all_src[i] = static_cast<int>(i);
    for (size_t i = 0; i < all_dst.size(); ++i) all_dst[i] = static_cast<int>(i);
    std::vector<int64_t> zs(all_src.size(), 0), zd(all_dst.size(), 0);
    for (const Transfer& t :
         plan_transfers(holders(p.shape, s.before, zs, all_src), holders(p.shape, s.after, zd, all_dst))) {
      if (t.src == t.dst) continue;
      traffic[t.src] += t.box.numel(), traffic[t.dst] += t.box.numel(), ++messages[t.src], ++messages[t.dst];
    }
  }
  int64_t busiest = 0, most_messages = 0;
  for (auto& [proc, n] : traffic) busiest = std::max(busiest, n);
  for (auto& [proc, n] : messages) most_messages = std::max(most_messages, n);
  s.bytes = busiest * static_cast<int64_t>(dtype_size(p.dtype));
  s.cost_s = static_cast<double>(most_messages) * cost.p2p_alpha_s + static_cast<double>(s.bytes) / cost.p2p_bandwidth_Bps;
  p.steps.push_back(s);
  Builder dst(p.shape, p.dtype, s.after, cost);
  reshard_locally(dst, p.to.dist, p.shape.ndim());
  for (Step& t : dst.steps()) p.steps.push_back(std::move(t));
  total(p, "send_recv");
  return p;
}

}  // namespace

Plan plan_reshard(const Shape& shape, DType dtype, const Layout& from, const Layout& to, const CostModel& cost,
                  const PlanOptions& options) {
  from.dist.validate(shape.ndim(), from.mesh.ndim(), "the source layout");
  to.dist.validate(shape.ndim(), to.mesh.ndim(), "the target layout");
  SW_CHECK(from.mesh.size() >= 1 && to.mesh.size() >= 1, "reshard: a mesh needs at least one rank");
  for (int d = 0; d < from.mesh.ndim(); ++d) {  // a Partial left behind is reduced: arithmetic
    const bool kept = from.mesh == to.mesh && from.dist[d] == to.dist[d];
    if (from.dist[d].is_partial() && !kept && is_storage_only(dtype)) {
      check_computable(dtype, fmt::format("reshard {} -> {} reduces a Partial", from.to_string(), to.to_string()));
    }
  }
  Plan base;
  base.shape = shape;
  base.dtype = dtype;
  base.from = from;
  base.to = to;
  if (!(from.mesh == to.mesh)) return send_recv_plan(base, cost);
  if (from.dist == to.dist) {
    total(base, "none");
    return base;
  }
  switch (options.strategy) {
    case PlanOptions::Strategy::Collectives: return collectives_plan(base, cost);
    case PlanOptions::Strategy::Redistribute: return redistribute_plan(base, cost);
    case PlanOptions::Strategy::Auto: break;
  }
  Plan a = collectives_plan(base, cost), b = redistribute_plan(base, cost);
  return b.cost_s < a.cost_s ? b : a;
}

}  // namespace shardwise::reshard
