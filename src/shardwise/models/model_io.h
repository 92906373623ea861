#pragma once
// The model's weights on disk, apart from a training run. Checkpoints use Hugging Face's GPT-2
// layout, so `GPT2LMHeadModel.from_pretrained` (and AutoModelForCausalLM) loads them as they are:
// config.json is a GPT2Config and the tensors have GPT-2's names and layouts. The model keeps q, k
// and v as separate parameters (tensor parallelism splits each by heads); the key map places them
// side by side in GPT-2's fused attn.c_attn (Conv1D layout [in, out]: q in columns [0, H), k in
// [H, 2H), v in [2H, 3H)). Every other parameter is stored whole under its own name.
//
// Checkpoints of the earlier layout (model_type "shardwise_gpt": separate q_proj/k_proj/v_proj
// keys) load as they are; directories written by transformers' `save_pretrained` load too.
//
// Llama (llama.h) uses transformers' LlamaForCausalLM layout: config.json a LlamaConfig, every
// parameter stored whole under its own name in its own layout (the key map is empty).
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/models/gpt.h"

namespace shardwise::train {

// The table of the model's parameters in GPT-2's files (key_map.h): q/k/v weights and biases of
// every layer placed in attn.c_attn.
ckpt::KeyMap gpt2_key_map(const GptConfig& config);
// Mixtral's experts (MoE Llama): each stacked experts.w1/w3/w2 [E, ...] of an MoE layer stored as E
// slices "model.layers.N.block_sparse_moe.experts.<e>.w1.weight" (KeyMap::place_slices).
ckpt::KeyMap mixtral_key_map(const GptConfig& config);
// The table a checkpoint of `config` is saved with: gpt2_key_map, mixtral_key_map for an MoE Llama,
// or empty for a dense Llama.
ckpt::KeyMap model_key_map(const GptConfig& config);

// True for the model_types the Llama builder reads (llama, mistral, mixtral, qwen2, qwen3, and
// shardwise_mixtral: Mixtral with dense layers among the MoE ones, its mlp_only_layers).
bool is_llama_model_type(const std::string& model_type);

// Special token ids written to config.json and generation_config.json (all inside the vocabulary).
struct SpecialTokens {
  int64_t bos = 0, eos = 0, pad = 0;
};
// Byte vocabularies (<= 256; the addition task, byte text): '\n' (10), the addition task's
// separator and padding. Larger ones: GPT-2's <|endoftext|> 50256 when the vocabulary holds it,
// else the last id.
SpecialTokens default_special_tokens(int64_t vocab);

// The special-token fields of a model directory as stored: bos_token_id, eos_token_id and
// pad_token_id of its config.json and of its generation_config.json (the two may differ; each value
// an id, null, or for eos a list of ids). A field the file lacks is absent; without a
// generation_config.json, transformers derives one from config.json: `generation` is config's.
struct StoredTokenIds {
  nlohmann::json config = nlohmann::json::object(), generation = nlohmann::json::object();
};
StoredTokenIds read_stored_token_ids(const ckpt::fs::path& dir);
// `file` (config.json or generation_config.json) with its special-token fields replaced by
// `stored`'s: a field `stored` lacks is removed (transformers' default applies, as it did to the
// directory), except those named in `keep` (what the run sets itself), which stay as they are.
nlohmann::json with_stored_token_ids(nlohmann::json file, const nlohmann::json& stored,
                                     const std::vector<std::string>& keep);

// `config` with the special tokens' ids and the stored dtype as transformers names them (every
// architecture's config.json carries both).
nlohmann::json with_tokens_and_dtype(const SpecialTokens& tokens, DType stored, nlohmann::json config);
// config.json as transformers' GPT2Config (model_type gpt2, GPT2LMHeadModel), `stored` the dtype
// the weights are saved in.
nlohmann::json gpt2_config_json(const GptConfig& config, DType stored, const SpecialTokens& tokens);
// config.json as transformers' LlamaConfig (model_type llama, LlamaForCausalLM).
nlohmann::json llama_config_json(const GptConfig& config, DType stored, const SpecialTokens& tokens);
// config.json as transformers' Qwen2Config (model_type qwen2, Qwen2ForCausalLM: q/k/v biases) or,
// for the qwen3 family, Qwen3Config (Qwen3ForCausalLM: per-head q/k norms, attention_bias false).
nlohmann::json qwen2_config_json(const GptConfig& config, DType stored, const SpecialTokens& tokens);
// gpt2_config_json, llama_config_json, qwen2_config_json (Qwen2, Qwen3), mistral's or mixtral's.
nlohmann::json model_config_json(const GptConfig& config, DType stored, const SpecialTokens& tokens);
// The config.json fields that make a checkpoint the same model as `config` (resume compares them).
std::vector<std::string> model_identity_keys(const GptConfig& config);
nlohmann::json generation_config_json(const GptConfig& config, const SpecialTokens& tokens);

// The model configuration of `dir`'s config.json (GPT2Config, LlamaConfig or the earlier
// shardwise_gpt one). Error naming the file and the field when it is a model shardwise cannot
// build exactly (another model_type; GPT-2: an untied head, n_inner other than 4 x n_embd, another
// activation, ...; Llama: biases, another activation, rope scaling, a head_dim other than
// hidden_size / num_attention_heads, ...).
GptConfig read_model_config(const ckpt::fs::path& dir);
// A LlamaConfig's fields (`file` names it in errors); max_position_embeddings gives `seq`.
GptConfig read_llama_config(const nlohmann::json& config, const std::string& file);
// The indices of `config`'s MoE layers, in order (none without experts).
std::vector<int64_t> moe_layer_list(const GptConfig& config);
// What makes a model directory (`saved`) another model than the run's, each as "<config.json
// field> <directory's> (directory) vs <run's> (this run)"; empty when the weights fit. A Llama run
// may train on sequences shorter than the directory's max_position_embeddings.
std::vector<std::string> model_differences(const GptConfig& saved, const GptConfig& run);

// The dropout probability a model directory's config.json trains with: GPT-2's resid_pdrop,
// embd_pdrop and attn_pdrop (transformers' default 0.1 where absent; 0 for the earlier
// shardwise_gpt layout), Llama's and Mixtral's attention_dropout (default 0). shardwise's GPT-2
// drops out at GPT-2's sites (embeddings, attention probabilities, both residual branches) with one
// probability: Error naming the three values when they differ.
double stored_dropout(const ckpt::fs::path& dir);

// How model directory `dir` stores its linear weights, by its config.json's model_type: true for
// GPT-2's Conv1D [in, out], false for Llama's and Mixtral's nn.Linear [out, in]; nullopt without a
// config.json or for another model_type.
std::optional<bool> linear_weights_in_out(const ckpt::fs::path& dir);

// True when `dir` holds the earlier layout (separate q/k/v keys); false for GPT-2's and Llama's.
bool is_legacy_layout(const ckpt::fs::path& dir);
// The key map to read `dir` with: model_key_map, or empty for the earlier GPT layout.
ckpt::KeyMap key_map_for(const ckpt::fs::path& dir, const GptConfig& config);

// What identifies the weights of model directory `dir` cheaply: for each file of its weights
// (master_weights, else model), its name, size and the xxh64 of its first and last MiB.
std::string model_fingerprint(const ckpt::fs::path& dir);

// This process's blocks of the model weights `specs` asks for (the model's parameter names, f32),
// from the fp32 masters when the checkpoint has them, else the weights (converted to f32). Keys
// matching `ignore_keys` (globs of parameter names or file keys) may be missing or unexpected; a
// transformers directory's tied lm_head.weight (GPT-2, a tied Llama), GPT-2's attention-mask buffers
// and Llama's rotary inv_freq buffers are skipped.
std::map<std::string, Tensor> load_model_weights(const ckpt::fs::path& dir, const GptConfig& config,
                                                 std::span<const ckpt::LoadSpec> specs, int64_t process,
                                                 const std::vector<std::string>& ignore_keys = {});

}  // namespace shardwise::train
