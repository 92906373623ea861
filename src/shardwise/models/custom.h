#pragma once
// A model built outside the built-in builders: the Python package's modules (python/src/graph.cc)
// trace their graph through the graph builder and hand the Trainer a CustomModel in
// GptConfig::custom. The stages, the runner, autodiff, completion, lowering, the optimizer and the
// loader are the built-in models' (build_model, init_model_param_block dispatch here); only the
// graph and the parameters' initial values come from the model.
//
// The graph of one micro-batch takes the inputs "ids" and "labels" [B, S] i64 (B the micro-batch's
// sequences over the whole dp dim), annotated by the builder, and gives a scalar loss: the mean
// over the micro-batch's tokens, as the built-in models' "loss". A model with `feeds` takes those
// inputs instead (any shape [B, ...] and dtype, annotated S(0) over the data dims as ids are), bound
// each step from the batch the caller hands it (Trainer.step(batch=...)); the loader reads nothing.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/models/gpt.h"

namespace shardwise::train {

// A parameter's initial value: normal(0, std) keyed by (seed, name) at the global element index
// (normal_param_block: the built-in models' draw) when std > 0, else the constant `value`.
struct ParamInit {
  double std = 0, value = 0;
};

// An MoE layer of a custom model (nn.MoE): its moe_mlp node's first output `op` (its statistics are
// the outputs op:1 .. op:4, moe_op_stat_names), the layer the metrics name
// and its experts.
struct CustomMoe {
  int64_t layer = 0;
  std::string op;
  int64_t experts = 0;
};

struct CustomModel {
  std::string description;  // for the run header ("python: GPT2 (examples/gpt2.py)")
  // The graph of one micro-batch of `sequences` sequences of config.seq tokens on `strategy`'s mesh,
  // its parameters stored as config.param_dtype and its dropout keyed by config.dropout_seed:
  // `training` false for the loss-only graph (no dropout); `part` a pipeline stage's layers (as
  // build_gpt's: "stage_input" in, the output and its "@grad_in" out where the part lacks the
  // embeddings or the head). Called by every rank (possibly at once), once per graph.
  std::function<GptGraph(const GptConfig& config, const Strategy& strategy, int64_t sequences, bool training,
                         const GptPart& part)>
      build;
  // The predictions graph (Trainer.evaluate(batch)): the forward without dropout, no loss read and no
  // backward, its outputs the values named by outputs(); null: the model builds none.
  std::function<GptGraph(const GptConfig& config, const Strategy& strategy, int64_t sequences, const GptPart& part)>
      predictions;
  // The outputs the model marks (nn.output), by name: values of the predictions graph of the stage
  // that makes them (known once that graph was built).
  std::function<std::vector<std::string>()> outputs;
  // Its MoE layers, in layer order (known once the graphs holding them were built): their router
  // statistics go into the metrics as the built-in MoE's do.
  std::function<std::vector<CustomMoe>()> moe_layers;
  // The parameter both the first and the last stage hold (a head tied to the embedding), whose
  // gradients the pipeline sums; "" for none. Known once a graph was built.
  std::function<std::string()> tied;
  // The initial value of the parameter `name` (known once a graph holding it was built).
  std::function<ParamInit(const std::string& name)> init;
  // Its constant inputs by name (bound once on every rank, as the built-in models' causal mask and
  // rotary positions): known once a graph was built.
  std::function<std::map<std::string, Tensor>()> constants;
  // The inputs the caller feeds each step in place of the loader's "ids" and "labels" (empty: the
  // loader's token ids), and this step's whole batch of one of them: [global batch, ...], its rows
  // in sample order (micro-batch m's are rows [m x B, (m + 1) x B)). Read by every rank during a step.
  std::vector<std::string> feeds;
  std::function<Tensor(const std::string& name)> batch;
  // The config.json of its checkpoints (the user's, e.g. a Hugging Face config); null: none given.
  // Its parameters are saved under their own names (no key map).
  nlohmann::json config;
};

// A custom model whose inputs the caller feeds (CustomModel::feeds): no loader reads for it.
inline bool fed_batches(const GptConfig& config) { return config.custom && !config.custom->feeds.empty(); }

// build_model for a custom model: the loss graph (`training`), or the predictions graph when the
// model builds one (else an error naming the model).
GptGraph build_custom(const GptConfig& config, const Strategy& strategy, int64_t sequences, bool training,
                      const GptPart& part);
// The config.json a custom model's checkpoints carry: the model's own, with "shardwise_model" (its
// description), the sequence length and the vocabulary added when absent.
nlohmann::json custom_config_json(const GptConfig& config);
Tensor init_custom_block(const GptConfig& config, const std::string& name, const Shape& shape,
                         std::span<const int64_t> offset, const Shape& block, uint64_t seed);

}  // namespace shardwise::train
