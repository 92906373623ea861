// Llama's Hugging Face layout (model_io.h): config.json as transformers' LlamaConfig, read back
// with what this Llama cannot build refused; and the model comparisons both architectures share.
#include "shardwise/core/error.h"
#include "shardwise/models/custom.h"
#include "shardwise/models/llama.h"
#include "shardwise/models/model_io.h"

namespace shardwise::train {

nlohmann::json llama_config_json(const GptConfig& m, DType stored, const SpecialTokens& t) {
  return with_tokens_and_dtype(t, stored, {{"architectures", {"LlamaForCausalLM"}},
                                          {"model_type", "llama"},
                                          {"num_hidden_layers", m.layers},
                                          {"num_attention_heads", m.heads},
                                          {"num_key_value_heads", m.key_value_heads()},
                                          {"hidden_size", m.hidden},
                                          {"head_dim", m.head_size()},
                                          {"intermediate_size", m.mlp_width()},
                                          {"max_position_embeddings", m.seq},
                                          {"vocab_size", m.vocab},
                                          {"hidden_act", "silu"},
                                          {"rms_norm_eps", m.rms_norm_eps},
                                          // transformers 5 reads rope_parameters, earlier ones rope_theta.
                                          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", m.rope_theta}}},
                                          {"rope_theta", m.rope_theta},
                                          {"rope_scaling", nullptr},
                                          {"attention_bias", false},
                                          {"mlp_bias", false},
                                          {"attention_dropout", m.dropout},
                                          {"initializer_range", m.init_std},
                                          {"pretraining_tp", 1},
                                          {"tie_word_embeddings", m.tie_word_embeddings},
                                          {"use_cache", true}});
}

// Mixtral's config.json: LlamaConfig's fields that MixtralConfig shares, and its experts. Mixtral
// has an MoE MLP in every layer: a model with dense layers among them (--moe-layers) is written as
// model_type "shardwise_mixtral" with Qwen2-MoE's "mlp_only_layers" (the dense layers), which
// shardwise reads back and transformers refuses by that model_type (no transformers class has
// Mixtral's keys with dense layers and no q/k/v biases).
nlohmann::json mixtral_config_json(const GptConfig& m, DType stored, const SpecialTokens& t) {
  SW_CHECK(m.router == "softmax" && m.shared_expert_width == 0,
           "--router {} --shared-expert-width {}: Mixtral's config.json (the checkpoint layout) has a softmax router "
           "and no shared expert: this model cannot be saved in Hugging Face's layout", m.router, m.shared_expert_width);
  nlohmann::json j = llama_config_json(m, stored, t);
  for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(k);
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j["num_local_experts"] = m.experts;
  j["num_experts_per_tok"] = m.top_k;
  j["router_aux_loss_coef"] = m.aux_loss;
  j["output_router_logits"] = false;
  j["router_jitter_noise"] = 0.0;
  j["sliding_window"] = nullptr;
  std::vector<int64_t> dense;
  for (int64_t l = 0; l < m.layers; ++l)
    if (!m.is_moe_layer(l)) dense.push_back(l);
  if (!dense.empty()) {
    j["architectures"] = {"ShardwiseMixtralForCausalLM"};
    j["model_type"] = "shardwise_mixtral";
    j["mlp_only_layers"] = dense;
  }
  return j;
}

ckpt::KeyMap mixtral_key_map(const GptConfig& c) {
  ckpt::KeyMap m;
  const int64_t E = c.experts, I = c.mlp_width(), H = c.hidden;
  for (int64_t l = 0; l < c.layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string p = fmt::format("model.layers.{}.block_sparse_moe.experts.", l);
    for (auto [w, shape] : {std::pair{"w1", Shape{E, I, H}}, {"w3", Shape{E, I, H}}, {"w2", Shape{E, H, I}}}) {
      std::vector<std::string> keys;
      for (int64_t e = 0; e < E; ++e) keys.push_back(fmt::format("{}{}.{}.weight", p, e, w));
      m.place_slices(p + w, shape, keys);
    }
  }
  return m;
}

// Qwen2's config.json: LlamaConfig's fields that Qwen2Config shares (its q/k/v biases are not a
// field: Qwen2 always has them), and no sliding window; Qwen3's: the same with head_dim and
// attention_bias false (its q/k norms are not a field either).
nlohmann::json qwen2_config_json(const GptConfig& m, DType stored, const SpecialTokens& t) {
  nlohmann::json j = llama_config_json(m, stored, t);
  for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp", "head_dim"}) j.erase(k);
  const bool qwen3 = qk_norm(m);
  if (qwen3) j["attention_bias"] = false;
  if (qwen3 || m.head_dim > 0) j["head_dim"] = m.head_size();  // Qwen2 reads it too when present
  j["architectures"] = {qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"};
  j["model_type"] = m.family;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = m.layers;
  return j;
}

// Mistral's config.json: LlamaConfig's fields that MistralConfig shares, and its sliding window
// (null when the model has none).
nlohmann::json mistral_config_json(const GptConfig& m, DType stored, const SpecialTokens& t) {
  nlohmann::json j = llama_config_json(m, stored, t);
  for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(k);
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = m.sliding_window > 0 ? nlohmann::json(m.sliding_window) : nlohmann::json();
  return j;
}

nlohmann::json model_config_json(const GptConfig& m, DType stored, const SpecialTokens& t) {
  if (m.custom) return custom_config_json(m);
  if (m.is_llama() && m.family == "mistral") return mistral_config_json(m, stored, t);
  if (m.is_llama() && m.experts > 0) return mixtral_config_json(m, stored, t);
  if (m.is_llama() && m.family != "llama") return qwen2_config_json(m, stored, t);
  return m.is_llama() ? llama_config_json(m, stored, t) : gpt2_config_json(m, stored, t);
}

std::vector<std::string> model_identity_keys(const GptConfig& m) {
  if (!m.is_llama()) return {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
  std::vector<std::string> keys = {"model_type",        "num_hidden_layers",       "num_attention_heads",
                                   "num_key_value_heads", "hidden_size",            "intermediate_size",
                                   "max_position_embeddings", "vocab_size",         "tie_word_embeddings"};
  if (m.experts > 0) keys.insert(keys.end(), {"num_local_experts", "num_experts_per_tok", "mlp_only_layers"});
  return keys;
}

namespace {

// The MoE layers of a "shardwise_mixtral" config.json: those its mlp_only_layers does not name.
std::vector<int64_t> moe_layers_of(const nlohmann::json& j, int64_t layers, const std::string& file) {
  SW_CHECK(j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array(),
           "'{}': model_type shardwise_mixtral needs mlp_only_layers (its dense layers)", file);
  std::vector<bool> dense(static_cast<size_t>(layers), false);
  for (const nlohmann::json& l : j["mlp_only_layers"]) {
    SW_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < layers,
             "'{}': mlp_only_layers names {}; the model has layers 0 .. {}", file, l.dump(), layers - 1);
    dense[static_cast<size_t>(l.get<int64_t>())] = true;
  }
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < layers; ++l)
    if (!dense[static_cast<size_t>(l)]) moe.push_back(l);
  SW_CHECK(!moe.empty(), "'{}': mlp_only_layers names every layer: no layer has experts (drop num_local_experts)", file);
  return moe;
}

double rope_theta_of(const nlohmann::json& j, const std::string& file) {
  // transformers 5: rope_parameters {rope_type, rope_theta}; earlier: rope_theta and rope_scaling.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const nlohmann::json& r = j["rope_parameters"];
    const std::string type = r.value("rope_type", r.value("type", "default"));
    SW_CHECK(type == "default", "'{}': rope_parameters.rope_type = '{}' is not supported (shardwise's Llama has the "
             "default rotary embedding)", file, type);
    if (r.contains("rope_theta")) return r["rope_theta"].get<double>();
  }
  SW_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
           "'{}': rope_scaling = {} is not supported (shardwise's Llama has the default rotary embedding)", file,
           j.contains("rope_scaling") ? j["rope_scaling"].dump() : "");
  return j.value("rope_theta", 10000.0);
}

}  // namespace

GptConfig read_llama_config(const nlohmann::json& j, const std::string& file) {
  auto field = [&](const char* key) {
    SW_CHECK(j.contains(key) && j[key].is_number_integer(), "'{}': config.json has no integer '{}'", file, key);
    return j[key].get<int64_t>();
  };
  GptConfig c;
  c.model_type = "llama";
  c.layers = field("num_hidden_layers");
  c.heads = field("num_attention_heads");
  c.hidden = field("hidden_size");
  c.intermediate_size = field("intermediate_size");
  c.seq = field("max_position_embeddings");
  c.vocab = field("vocab_size");
  c.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? j["num_key_value_heads"].get<int64_t>() : c.heads;
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.init_std = j.value("initializer_range", c.init_std);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);  // LlamaConfig's default
  c.rope_theta = rope_theta_of(j, file);
  // What LlamaForCausalLM can be configured to do that this model does not.
  auto refuse_unless = [&](bool ok, const char* key, const std::string& want) {
    SW_CHECK(ok, "'{}': {} = {} is not supported (shardwise's Llama has {})", file, key,
             j.contains(key) ? j[key].dump() : "(missing)", want);
  };
  const std::string type = j.value("model_type", "");
  if (type == "qwen2" || type == "qwen3") {  // q/k/v biases (Qwen2), q/k norms (Qwen3); a sliding window if used
    c.family = type;
    const bool windowed = j.value("use_sliding_window", false) && j.contains("sliding_window") &&
                          !j["sliding_window"].is_null() && j["sliding_window"].get<int64_t>() < c.seq;
    refuse_unless(!windowed, "sliding_window", fmt::format("full causal attention (use_sliding_window false, or a "
                  "window of at least max_position_embeddings = {})", c.seq));
  }
  if (type == "mistral") {  // MistralConfig: Llama's graph; a sliding window shorter than the run's sequence is refused
    c.family = type;
    if (j.contains("sliding_window") && !j["sliding_window"].is_null()) c.sliding_window = field("sliding_window");
    if (c.sliding_window >= c.seq) c.sliding_window = 0;  // no sequence of the model reaches past it
  }
  if (type == "mixtral" || type == "shardwise_mixtral") {  // MixtralConfig: no biases, experts in every layer
    c.experts = field("num_local_experts");
    if (type == "shardwise_mixtral") c.moe_layers = moe_layers_of(j, c.layers, file);
    c.top_k = field("num_experts_per_tok");
    c.aux_loss = j.value("router_aux_loss_coef", 0.0);
    refuse_unless(j.value("router_jitter_noise", 0.0) == 0.0, "router_jitter_noise", "no router noise");
    refuse_unless(!j.contains("sliding_window") || j["sliding_window"].is_null() ||
                      j["sliding_window"].get<int64_t>() >= c.seq,
                  "sliding_window", "full causal attention (a window of at least max_position_embeddings)");
  }
  refuse_unless(j.value("hidden_act", "silu") == "silu", "hidden_act", "silu (SwiGLU)");
  if (c.family != "qwen2") refuse_unless(!j.value("attention_bias", false), "attention_bias", "no biases");
  refuse_unless(!j.value("mlp_bias", false), "mlp_bias", "no biases");
  SW_CHECK(c.heads >= 1, "'{}': num_attention_heads must be at least 1", file);
  SW_CHECK(c.kv_heads >= 1 && c.heads % c.kv_heads == 0,
           "'{}': num_key_value_heads = {} must divide num_attention_heads = {} (grouped-query attention)", file,
           c.kv_heads, c.heads);
  // LlamaConfig's and Qwen3Config's head_dim: q_proj [heads x head_dim, H], o_proj [H, heads x head_dim].
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    SW_CHECK(j["head_dim"].is_number_integer() && j["head_dim"].get<int64_t>() >= 1,
             "'{}': head_dim = {} must be a positive integer", file, j["head_dim"].dump());
    if (j["head_dim"].get<int64_t>() != c.hidden / c.heads) c.head_dim = j["head_dim"].get<int64_t>();
  }
  c.validate();
  return c;
}

std::vector<int64_t> moe_layer_list(const GptConfig& c) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < c.layers; ++l)
    if (c.is_moe_layer(l)) out.push_back(l);
  return out;
}

namespace {

}  // namespace

std::vector<std::string> model_differences(const GptConfig& saved, const GptConfig& mine) {
  std::vector<std::string> differ;
  if (saved.model_type != mine.model_type) {
    differ.push_back(fmt::format("model_type '{}' (directory) vs '{}' (this run, --model)", saved.model_type,
                                 mine.model_type));
    return differ;
  }
  auto compare = [&](const char* key, int64_t a, int64_t b) {
    if (a != b) differ.push_back(fmt::format("{} {} (directory) vs {} (this run)", key, a, b));
  };
  if (!mine.is_llama()) {
    compare("n_layer", saved.layers, mine.layers);
    compare("n_head", saved.heads, mine.heads);
    compare("n_embd", saved.hidden, mine.hidden);
    compare("n_positions", saved.seq, mine.seq);
    compare("vocab_size", saved.vocab, mine.vocab);
    return differ;
  }
  compare("num_hidden_layers", saved.layers, mine.layers);
  compare("num_attention_heads", saved.heads, mine.heads);
  compare("num_key_value_heads", saved.key_value_heads(), mine.key_value_heads());
  compare("hidden_size", saved.hidden, mine.hidden);
  compare("head_dim", saved.head_size(), mine.head_size());
  compare("intermediate_size", saved.mlp_width(), mine.mlp_width());
  compare("vocab_size", saved.vocab, mine.vocab);
  compare("tie_word_embeddings", saved.tie_word_embeddings, mine.tie_word_embeddings);
  compare("num_local_experts (--experts)", saved.experts, mine.experts);
  if (saved.family != mine.family)
    differ.push_back(fmt::format("model_type '{}' (directory) vs '{}' (this run)", saved.family, mine.family));
  if (saved.experts > 0 && mine.experts > 0) compare("num_experts_per_tok (--top-k)", saved.top_k, mine.top_k);
  if (saved.experts > 0 && mine.experts > 0 && moe_layer_list(saved) != moe_layer_list(mine))
    differ.push_back(fmt::format("MoE layers [{}] (directory) vs [{}] (this run, --moe-layers)",
                                 fmt::join(moe_layer_list(saved), ","), fmt::join(moe_layer_list(mine), ",")));
  if (mine.seq > saved.seq)  // no parameter depends on it, but the positions were trained up to it
    differ.push_back(fmt::format("max_position_embeddings {} (directory) vs sequences of {} (this run)", saved.seq,
                                 mine.seq));
  return differ;
}

}  // namespace shardwise::train
