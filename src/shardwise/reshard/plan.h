#pragma once
// Reshard plans: how a tensor distributed one way (a mesh + placements) becomes distributed
// another way, as a list of steps with an estimated cost.
//
// Step kinds and what each does to the distribution `before` -> `after`:
//   all_reduce(m, op)        Partial(op) on mesh dim m -> Replicate
//   reduce_scatter(m, d, op) Partial(op) on m -> Shard(d) (m splits d last)
//   all_gather(m, d)         Shard(d) on m (the last mesh dim splitting d) -> Replicate
//   all_to_all(m, d -> e)    Shard(d) on m -> Shard(e) on m
//   local_slice              Replicate -> Shard on one or more mesh dims, no communication
//   partialize(m, op)        Replicate -> Partial(op): sum keeps the value on coordinate 0 of m and
//                            zeros elsewhere; avg, max, min keep it everywhere; no communication
//   redistribute(dims)       any Shard/Replicate layout -> any other on the same mesh, by one
//                            all_to_all_v among the ranks that differ only in `dims`
//   send_recv                a Shard/Replicate layout on one mesh -> a layout on another mesh (other
//                            processes or another shape), point to point
// A value that is Partial on several mesh dims is reduced over the last such mesh dim first, so
// a Partial dim is only reduced while every later Partial dim commutes with it (both sum/avg, or
// the same op). A step that changes placements on mesh dims of one rank only moves nothing and is
// left out (a dp = 1 gradient's P(sum) -> R: a plan with no steps, whose output is its input).
#include <string>
#include <vector>

#include "shardwise/core/dtype.h"
#include "shardwise/core/shape.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"

namespace shardwise::reshard {

struct Layout {
  mesh::ProcessMesh mesh;
  mesh::DistAttr dist;
  std::string to_string() const;  // "mesh=[2,2] S(0),P(sum)"
};

// Parses "mesh=2x2 S(0),P" or "mesh=2x2 ranks=4-7 R,S(1)" (ranks: the mesh's processes, row-major,
// as "a-b" or "a,b,c"; default 0..n-1).
Layout parse_layout(std::string_view text);

// Alpha-beta cost per mesh dim: a message costs alpha seconds plus bytes / bandwidth. Ring
// collectives over k ranks pay (k - 1) alphas and the bus-bandwidth factor of nccl-tests:
// all_reduce 2(k-1)/k of the buffer, all_gather / reduce_scatter / all_to_all (k-1)/k.
struct CostModel {
  double alpha_s = 5e-6;
  double bandwidth_Bps = 10e9;
  // Per mesh dim overrides (index = mesh dim); empty or <= 0 entries use the defaults.
  std::vector<double> dim_alpha_s;
  std::vector<double> dim_bandwidth_Bps;
  // Between different meshes (pipeline stages).
  double p2p_alpha_s = 5e-6;
  double p2p_bandwidth_Bps = 10e9;
  double alpha(int mesh_dim) const;
  double bandwidth(int mesh_dim) const;
};

enum class StepKind { AllReduce, ReduceScatter, AllGather, AllToAll, LocalSlice, Partialize, Redistribute, SendRecv };
std::string_view step_kind_name(StepKind kind);

struct Step {
  StepKind kind = StepKind::LocalSlice;
  int mesh_dim = -1;                       // collectives and partialize
  int tensor_dim = -1;                     // gathered / scattered dim; all_to_all: the dim unsharded
  int to_tensor_dim = -1;                  // all_to_all: the dim sharded
  mesh::ReduceOp op = mesh::ReduceOp::Sum;  // all_reduce, reduce_scatter, partialize
  std::vector<int> group_dims;             // redistribute: the mesh dims of its groups
  Layout before, after;
  int64_t bytes = 0;     // bytes sent by the busiest rank (estimate for collectives)
  double cost_s = 0;
  std::string to_string() const;
};

struct Plan {
  Shape shape;
  DType dtype = DType::F32;
  Layout from, to;
  std::vector<Step> steps;
  double cost_s = 0;
  int64_t bytes = 0;
  std::string strategy;  // "collectives", "redistribute", "send_recv", "none"
  std::string to_string() const;
};

struct PlanOptions {
  // "auto" picks the cheaper of the per-dim collectives and one redistribute; the others force one
  // (tests use them to check both executors on every pair).
  enum class Strategy { Auto, Collectives, Redistribute } strategy = Strategy::Auto;
};

// The cheapest plan for a tensor of `shape` and `dtype` from `from` to `to`. Error when a layout
// does not fit the tensor or its mesh.
Plan plan_reshard(const Shape& shape, DType dtype, const Layout& from, const Layout& to, const CostModel& cost = {},
                  const PlanOptions& options = {});

}  // namespace shardwise::reshard
