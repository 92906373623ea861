#pragma once
// Completion: the distribution of every value of a graph on a mesh, from a few annotations.
//
// 1. Annotated values keep their annotation (annotated beats inferred).
// 2. Reverse pass: from annotated activations, the ops' reverse rules suggest distributions for
//    the unannotated inputs and parameters upstream of them.
// 3. Forward pass, node by node: the forward rule (Backward nodes: the grad rule, with the forward
//    node's operands as the forward kernel saw them) says what each input must be and what the
//    outputs are. An unannotated input or parameter takes the distribution its first consumer
//    requires (starting from the reverse suggestion, else Replicate); an output takes the claimed
//    distribution unless annotated (then a reshard follows the node). Fill nodes produce Replicate.
// 4. An unannotated leaf read by several nodes that require different distributions takes the one
//    whose reshards to all its consumers cost least under the planner's cost model; passes 3-4
//    repeat until no leaf changes (a fixed point).
// 5. Each parameter's gradient must end in the parameter's distribution (so the optimizer updates
//    locally): a Partial gradient over the data-parallel dim becomes its all-reduce there.
// Every value records which rule and which neighbour decided it (`why`, for `plan --explain`).
#include <string>
#include <vector>

#include "shardwise/graph/graph.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/reshard/plan.h"

namespace shardwise::graph {

struct Completion {
  mesh::ProcessMesh mesh;
  std::vector<mesh::DistAttr> dist;  // per value: its distribution once produced (after any annotation reshard)
  std::vector<std::string> why;      // per value
  // Per node: the distributions its kernel reads (inputs) and writes (outputs).
  std::vector<std::vector<mesh::DistAttr>> node_inputs, node_outputs;
  int passes = 0;  // forward passes until the fixed point
};

struct CompletionOptions {
  reshard::CostModel cost;
  int max_passes = 8;
};

Completion complete(const Graph& g, const mesh::ProcessMesh& mesh, const CompletionOptions& options = {});

// Sharding stage 3 (FSDP), after completion: every parameter of g (not frozen leaves) that
// `mesh_dim` replicates is stored sharded over it on tensor dim 0, split after the mesh dims that
// already shard dim 0 (a tp block's rows are cut into mesh_dim chunks; uneven or empty chunks as
// the layout allows). The kernels keep reading the completed distributions (node_inputs), so
// lowering all-gathers each parameter before use, and its gradient, reduced into the parameter's
// distribution, becomes a reduce-scatter (LowerOptions::regather_params frees the gathered copies).
// Returns how many parameters it sharded.
int shard_params_over(const Graph& g, Completion& c, int mesh_dim);

// "h = matmul(x, w1)  [S(0),R] x [R,S(1)] -> [S(0),S(1)]" for every node, plus `why` on request.
std::string explain(const Graph& g, const Completion& c, ValueId v);

}  // namespace shardwise::graph
