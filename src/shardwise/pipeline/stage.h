#pragma once
// One pipeline stage as a program: the model builder gives the stage's forward graph (its input
// and output as graph values, the output's gradient as a graph input); compile_stage appends the
// backward part, completes and lowers it on the stage's sub-mesh and orders its instructions in
// three phases a schedule runs at different times:
//   forward         the forward nodes (and the reshards they need)
//   input gradient  what the gradient of the stage input needs (sent to the previous stage)
//   weight gradient everything else (parameter gradients); split schedules run it last, others
//                   run the whole backward in program order
#include <memory>
#include <string>
#include <vector>

#include "shardwise/graph/graph.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/process_mesh.h"

namespace shardwise::pipeline {

struct StageSpec {
  int stage = 0;
  std::shared_ptr<graph::Graph> graph;  // the forward part; compile_stage appends the backward
  std::string input;        // the activation received from the previous stage ("" on the first)
  std::string output;       // the activation sent to the next stage ("" on the last)
  std::string output_grad;  // the input that receives d(loss)/d(output) (with `output`)
  std::string loss;         // the last stage's scalar loss (training)
  // Values the caller reads after the forward (evaluation: predictions; a Python model's outputs).
  std::vector<std::string> results;
  // Small values (made in the forward, e.g. an MoE layer's expert counts) read after every
  // micro-batch's forward and summed over the micro-batches into StepStats::stat_sums.
  std::vector<std::string> stats;
  // A stage without the loss: its own scalar term of the loss (training; e.g. its MoE layers'
  // router losses), differentiated with gradient 1 beside `output_grad`, and read after every
  // forward into StepStats::extra_loss_sums.
  std::string extra_loss;
  std::vector<std::string> feeds;      // inputs bound per micro-batch by the caller (ids, labels)
  std::vector<std::string> constants;  // inputs bound once (the causal mask)
  bool training = true;
  // Mesh dims (by name) along which parameter gradients are left Partial (graph::LowerOptions):
  // sharding stage 2 puts "dp" here and reduce-scatters the sums itself.
  std::vector<std::string> partial_grad_dims;
  // Sharding stage 3: the mesh dims (by name; none: off) over which every parameter is stored
  // sharded, in this order after the dims already sharding its dim 0 (graph::shard_params_over per
  // dim that replicates it: dp and ep for dense parameters, dp for experts split over ep),
  // all-gathered before each use and re-gathered for the backward
  // (graph::LowerOptions::regather_params). Every graph of a run sharing the parameters needs it.
  std::vector<std::string> shard_params_dims;
};

struct CompiledStage {
  graph::Program program;
  std::vector<int> order;  // instructions in phase order
  size_t forward_end = 0, input_grad_end = 0;  // positions in `order`: [0, f) [f, i) [i, end)
  int forward_nodes = 0;
  std::string input_grad;  // the value holding the gradient of the stage input ("" on the first stage)
};

// Appends the backward (seeded with output_grad unless this is the last stage; parameter
// gradients split from input gradients where `split`), gives the input's gradient the input's
// annotation (so both stages know its layout without asking), completes, lowers and orders.
CompiledStage compile_stage(StageSpec& spec, const mesh::ProcessMesh& mesh, bool split);

// The sub-mesh of pipeline coordinate `coord` along mesh dim `pp_dim`: the other dims, their
// processes. A mesh with no other dim gives a mesh of one process, its dim named `single_name`.
mesh::ProcessMesh stage_mesh(const mesh::ProcessMesh& mesh, int pp_dim, int64_t coord,
                             const std::string& single_name);

}  // namespace shardwise::pipeline
