#pragma once
// Runs a graph on a mesh of threads and collects the global values: the single-device run (mesh
// [1]) is the reference every distributed run must reproduce.
#include <functional>
#include <map>
#include <string>

#include "shardwise/comm/local.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/runtime/runtime.h"

namespace shardwise::testing_support {

struct RunResult {
  std::map<std::string, Tensor> values;  // gathered global values
  std::map<std::string, Tensor> grads;   // gathered parameter gradients
  std::vector<runtime::RunStats> stats;  // per rank
  graph::Program program;
  std::string plan;                      // Program::to_string
};

// Builds the graph (with annotations for `mesh`), appends backward from value `loss`, completes,
// lowers and runs it on `mesh.size()` threads, with every input and parameter set from `data`
// (global tensors). Gathers `outputs` and every parameter gradient.
RunResult run_graph(const std::function<void(graph::Graph&)>& build, const mesh::ProcessMesh& mesh,
                    const std::map<std::string, Tensor>& data, const std::string& loss,
                    const std::vector<std::string>& outputs);

}  // namespace shardwise::testing_support
