#pragma once
// Graphs built from Python (python/shardwise/graph.py, nn.py): a graph builder on a mesh whose
// parameters carry their initial values, and the custom model that hands a traced Python model to
// the Trainer (models/custom.h).
#include <nanobind/nanobind.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/graph/graph.h"
#include "shardwise/mesh/strategy.h"
#include "shardwise/models/custom.h"

namespace shardwise::py {

namespace nb = nanobind;

// One graph being traced: the builder, the strategy it is built for, the parameters' initial values.
struct PyGraph {
  std::shared_ptr<graph::Graph> g = std::make_shared<graph::Graph>();
  mesh::Strategy strategy;
  DType param_dtype = DType::F32;  // how the run stores parameters (bf16: cast to f32 for the kernels)
  uint64_t seed = 0;               // the run's dropout seed
  std::map<std::string, train::ParamInit> inits;
  std::map<std::string, Tensor> constants;  // inputs bound once (copies of the caller's arrays)
  std::string cp_attention = "ring";        // the run's --cp-attention: ring (k, v travel) or gathered
};

// The batch a Python model's inputs are fed from (CustomModel::feeds): set by Trainer.step between
// steps, read by every rank during one.
struct FedBatch {
  std::mutex mu;
  std::map<std::string, Tensor> tensors;
};

// A CustomModel whose graphs come from `build(graph: _Graph (with the run's parameter dtype and
// dropout seed), sequences: int, seq: int, training: bool, part: (first_layer, end_layer,
// embeddings, head), predicting: bool) -> (loss, input, output, output_grad, extra_loss, tied,
// outputs, moe)` (value ids, -1 where absent; extra_loss: a stage's own loss terms before the last; the
// tied parameter's name or ""; the names of the values nn.output marked, in a predictions graph;
// the graph's nn.MoE layers as (layer, moe_mlp's first output, experts)),
// a Python callable the caller keeps alive while the model is in use; each graph is traced once
// (under the GIL) and copied for every rank after.
// `config_json`: its checkpoints' config.json (JSON text; "" for none). `feeds`: the inputs fed
// from `fed` each step in place of the loader's ids and labels (none: the loader's).
std::shared_ptr<const train::CustomModel> python_model(nb::handle build, std::string description,
                                                       const std::string& config_json,
                                                       std::vector<std::string> feeds = {},
                                                       std::shared_ptr<FedBatch> fed = nullptr);

void bind_graph(nb::module_& m);

}  // namespace shardwise::py
