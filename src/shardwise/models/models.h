#pragma once
// The architectures a run builds (GptConfig::model_type): GPT-2 (gpt.h) and Llama (llama.h),
// behind the few functions the stages, the trainer, the checkpoints and generation call.
#include <map>
#include <string>
#include <vector>

#include "shardwise/models/gpt.h"
#include "shardwise/models/gpt_decode.h"

namespace shardwise::train {

// build_gpt or build_llama.
GptGraph build_model(const GptConfig& config, const Strategy& strategy, int64_t sequences, bool training = true,
                     const GptPart& part = {});

// Generation's graphs: build_gpt_prefill / build_gpt_decode_step or the Llama ones (llama_decode.h).
DecoderGraph build_model_prefill(const GptConfig& config, const Strategy& strategy, int64_t sequences, int64_t length,
                                 const DecodePart& part = {});
DecoderGraph build_model_decode_step(const GptConfig& config, const Strategy& strategy, int64_t sequences,
                                     int64_t cache_length, const DecodePart& part = {});

// The initial value of one block of a parameter (init_param_block or init_llama_param_block), and
// of a whole parameter.
Tensor init_model_param_block(const GptConfig& config, const std::string& name, const Shape& shape,
                              std::span<const int64_t> offset, const Shape& block, uint64_t seed);
Tensor init_model_param(const GptConfig& config, const std::string& name, const Shape& shape, uint64_t seed);

// The token embedding when the head is tied to it (both ends of a pipeline hold it): GPT-2's
// "transformer.wte.weight", a tied Llama's "model.embed_tokens.weight"; "" for an untied head.
std::string tied_embedding(const GptConfig& config);

// Where a parameter lives: its layer (-1 for none), and whether the last stage holds it (the
// final norm, the untied head).
int64_t layer_of_param(const GptConfig& config, const std::string& name);
bool is_last_stage_param(const GptConfig& config, const std::string& name);

// The graph's constant inputs by name: "causal_mask" [S, S] (none with GptConfig::document_mask:
// "attention_mask" and "position_ids" come with each micro-batch), and Llama's "positions" [S]
// (GPT-2's too in cp's order, GptConfig::cp_order; none with document_mask either).
std::map<std::string, Tensor> model_constants(const GptConfig& config);
std::vector<std::string> model_constant_names(const GptConfig& config);  // their names, nothing allocated

// The number of parameters, and the largest parameter's name and element count (memory checks).
double parameter_count(const GptConfig& config);
std::pair<std::string, double> largest_parameter(const GptConfig& config);

// "GPT-2" or "Llama" (with its kv heads and head), for reports.
std::string describe_architecture(const GptConfig& config);
// The model as a run's header and memory plan name it: the architecture, its layers, hidden size (and
// `heads`), seq and vocab; a model written in Python by its own description, with the run's seq and
// vocab unless it is fed batches of its own (the options' layers, hidden and heads are not its).
std::string describe_model(const GptConfig& config, bool heads);

}  // namespace shardwise::train
