#pragma once
// Lowering: a completed graph becomes a program of instructions over buffers ("slots": a value in
// one distribution). Wherever a consumer needs a value in another distribution than its producer
// gives, a reshard instruction (the planner's steps) converts it once; later consumers needing the
// same distribution reuse that buffer. Partial values are therefore reduced lazily: only where a
// consumer's rule requires them reduced.
#include <string>
#include <vector>

#include "shardwise/graph/completion.h"
#include "shardwise/graph/graph.h"
#include "shardwise/reshard/plan.h"

namespace shardwise::graph {

struct Slot {
  std::string name;  // the value's name (several slots of one value differ in dist)
  ops::TensorMeta meta;
  mesh::DistAttr dist;
  ValueId value = -1;
};

enum class InstrKind { Kernel, Backward, Fill, Reshard };

struct Instr {
  InstrKind kind = InstrKind::Kernel;
  NodeId node = -1;  // Kernel, Backward, Fill
  std::vector<int> in, out;  // slots (-1: none)
  reshard::Plan plan;        // Reshard
};

struct Program {
  mesh::ProcessMesh mesh;
  std::vector<Slot> slots;
  std::vector<Instr> instrs;
  std::vector<int> value_slot;  // per graph value: its slot in its completed distribution (-1: never produced)
  // Per parameter (Graph::params() order): the slot of its gradient in the parameter's distribution.
  std::vector<int> param_grad_slot;
  double reshard_cost_s = 0;  // planner estimate, all reshards
  int64_t reshard_bytes = 0;  // bytes sent by the busiest rank, all reshards

  // One line per instruction: node with its operands' distributions, and each reshard with its
  // collectives and bytes; then totals and the count of each collective.
  std::string to_string(const Graph& g) const;
  // How many collective steps of each kind the reshards perform: {"all_reduce": 2, ...}.
  std::vector<std::pair<std::string, int>> collective_counts() const;
};

struct LowerOptions {
  reshard::CostModel cost;
  // The nodes in the order to lower them (a topological order of every node; empty: node id
  // order). apply_recompute gives one that runs recompute copies right before their first reader.
  std::vector<NodeId> order;
  // Mesh dims along which a parameter gradient that comes out Partial stays Partial in
  // `param_grad_slot` (its reduction left to the caller: sharding stage 2 reduce-scatters the dp
  // sums over the optimizer's shards instead of the all-reduce). Empty: every parameter gradient is
  // reduced into the parameter's distribution.
  std::vector<int> partial_grad_dims;
  // Sharding stage 3 (shard_params_over): a parameter laid out otherwise than its consumers read it
  // (Shard over dp) is resharded (all-gathered) for each forward consumer on its own, and once per
  // recompute segment (or per node outside one) for the backward: the gathered copy is freed after
  // its reader(s), never kept from the forward to the backward by reuse; a gradient kernel that
  // reads only its shape (OpDef::backward_reads) gets a slot no instruction produces (the runtime
  // hands it a stand-in). And each parameter gradient is reduced into the parameter's distribution
  // (the reduce-scatter) right after the node completing it, not after the whole backward. Off: one
  // reshard per distribution, reused by every later consumer; the gradients reduced at the end.
  bool regather_params = false;
};

// `order`: as LowerOptions::order.
Program lower(const Graph& g, const Completion& c, const reshard::CostModel& cost = {},
              const std::vector<NodeId>& order = {});
Program lower(const Graph& g, const Completion& c, const LowerOptions& options);

}  // namespace shardwise::graph
