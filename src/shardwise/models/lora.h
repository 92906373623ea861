#pragma once
// LoRA adapters on the linear layers of GPT-2 and of the Llama builder (Llama, Qwen2, Qwen3,
// Mistral, and the attention and experts of Mixtral-style MoE models), with PEFT's semantics and files. A
// target module with base weight W (GPT-2's Conv1D [in, out]; Llama's nn.Linear [out, in], read
// transposed) and bias b computes
//     y = x W + b + s (x A^T) B^T,   A [r, in], B [out, r],   s = alpha / r (rsLoRA: alpha / sqrt(r))
// while W, b and every other base parameter stay frozen (graph::ValueKind::Frozen: no gradient,
// no optimizer state). A starts Kaiming-uniform (PEFT's default: U(-1/sqrt(in), 1/sqrt(in))), drawn
// by Philox keyed by (seed, parameter name) at each global element index, so any mesh holds the
// same numbers; B starts at zero, so the adapted model starts as the base model.
//
// Modules have transformers' names. GPT-2, per layer: attn.c_attn (q|k|v fused), attn.c_proj,
// mlp.c_fc, mlp.c_proj. The Llama builder, per layer "model.layers.L.": self_attn.{q,k,v,o}_proj
// and, in a dense layer, mlp.{gate,up,down}_proj; in a MoE block the experts' fused parameters
// (below); its router and shared expert get no adapter, and a target naming one is refused. Targets match as PEFT's target_modules do: a list
// entry matches a module whose path equals it or ends with "." + it ("c_proj" matches both
// projections, "attn.c_proj" one); a regex (PEFT's string form) must match the whole path;
// "all-linear" (PEFT's shorthand) is every linear layer but the output head. No targets: PEFT's
// default for the model type (c_attn for GPT-2; q_proj, v_proj for Llama, Qwen2, Qwen3, Mistral
// and Mixtral). GPT-2 keeps q, k and v separate, so c_attn's adapter is one A shared by the three
// projections and B_q, B_k, B_v [H, r]; the key map places them in rows [0, H), [H, 2H), [2H, 3H)
// of PEFT's lora_B [3H, r].
//
// Tensor parallelism follows the base weight (models/gpt.cc, models/llama.cc): a column-parallel
// base (q/k/v, c_fc, gate/up) shards B on its output dim and replicates A; a row-parallel base
// (c_proj, o_proj, down_proj) shards A on its input dim (x A^T is then Partial(sum), like x W) and
// replicates B; a base replicated over tp (Llama's k/v when tp does not divide the kv heads)
// replicates both.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardwise/ckpt/key_map.h"
#include "shardwise/core/shape.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

struct GptConfig;

struct LoraConfig {
  int64_t rank = 0;      // r; 0: no adapters (every parameter trains)
  double alpha = 8;      // lora_alpha (PEFT's default)
  bool rslora = false;   // use_rslora: scale alpha / sqrt(r)
  double dropout = 0;    // lora_dropout on the adapter's input while training
  // target_modules; empty: PEFT's default for the model type (lora_default_targets); {"all-linear"}:
  // every linear layer but the output head.
  std::vector<std::string> targets;
  std::string target_regex;  // target_modules given as one string: a regex instead of `targets`
  bool enabled() const { return rank > 0; }
  double scale() const;
  bool targets_module(const std::string& path) const;  // PEFT's matching rule (of the listed targets)
  bool all_linear() const;  // targets is PEFT's "all-linear" (any case)
  bool operator==(const LoraConfig&) const = default;
};

// One adapted module of the model.
struct LoraModule {
  std::string path;  // "transformer.h.0.attn.c_attn": the module in transformers' GPT-2 and PEFT's keys
  int64_t in = 0, out = 0;  // its weight W [in, out]
  bool column = false;      // column-parallel base (B sharded over tp) or row-parallel (A sharded)
  std::vector<std::string> parts;  // the model's projections it covers: q_proj, k_proj, v_proj, or itself
  // Stacked experts (PEFT's target_parameters, lora.ParamWrapper): E, and the fused parameter of
  // transformers' Mixtral the adapter adapts ("model.layers.L.mlp.experts.gate_up_proj" or
  // ".down_proj"); 0 and "" for a linear module. A is [E r, in] (expert e's A in rows [e r, e r + r)),
  // B [out, E r] (expert e's B in columns k E + e, k < r): W_e + s B_e A_e is the expert's weight.
  int64_t experts = 0;
  std::string parameter;
};

// A MoE layer's experts are adapted as PEFT adapts transformers 5's fused expert parameters: a
// target naming experts.gate_up_proj (w1 | w3 of the stacked experts) or experts.down_proj (w2) is
// one of PEFT's target_parameters (matched as PEFT matches them: the parameter path equals it or
// ends with "." + it), and its module is "model.layers.L.mlp.experts", or ".experts.base_layer" for
// gate_up_proj when both are adapted (PEFT nests the second wrapper around the first).
// The adaptable modules of every layer that `config.lora` targets, in layer order. Error naming
// the target when an entry of the target list matches no module (listing the modules), when a
// target names a module LoRA cannot adapt here (embeddings, norms, the head, a MoE block's router
// or experts), on r <= 0, alpha 0, dropout outside [0, 1), or when nothing at all is targeted.
std::vector<LoraModule> lora_modules(const GptConfig& config);
// PEFT's default target_modules for the model type (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
std::vector<std::string> lora_default_targets(const GptConfig& config);
// target_modules as PEFT saves it: the list given, the model's default, every adapted module path
// for all-linear (PEFT resolves the shorthand so), or the regex.
nlohmann::json lora_target_modules(const GptConfig& config);
// target_parameters as PEFT saves it: the entries that name expert parameters (null when none).
nlohmann::json lora_target_parameters(const GptConfig& config);
// The targets as a run's header prints them: "q_proj, v_proj", "all-linear", or the regex.
std::string lora_targets_text(const GptConfig& config);

// The parameter names: A of a module ("<path>.lora_A.weight"), B of a part ("<part path>.lora_B.weight").
std::string lora_a_name(const std::string& module_path);
std::string lora_b_name(const std::string& part_path);
bool is_lora_param(const std::string& name);
// The parameter's initial block [offset, offset + block) (A: Kaiming uniform; B: zeros).
Tensor init_lora_block(const std::string& name, const Shape& shape, std::span<const int64_t> offset,
                       const Shape& block, uint64_t seed);

// The adapters in PEFT's file: "base_model.model.<module>.lora_A.weight" for each A, and each B
// placed in its module's lora_B (c_attn's three by rows).
ckpt::KeyMap lora_key_map(const GptConfig& config);

// adapter_config.json as PEFT writes it for this model's LoRA configuration (GPT-2's Conv1D:
// fan_in_fan_out true, Llama's nn.Linear false; task_type CAUSAL_LM; target_modules as
// lora_target_modules; every other field at PEFT's default; `base` the base model's path or null).
// PEFT's own peft_version is left out (PEFT fills in its version when it loads the file).
nlohmann::json adapter_config_json(const GptConfig& config, const std::string& base);
// The LoRA configuration of a PEFT adapter directory's adapter_config.json. Error naming the file
// and the field for what shardwise does not train the same way (another peft_type, DoRA, per-module
// ranks or alphas, adapted biases, modules_to_save, layer selections, another initialization).
LoraConfig read_adapter_config(const std::filesystem::path& dir);

}  // namespace shardwise::train
