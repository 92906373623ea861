#include "shardwise/models/model_io.h"

#include "shardwise/ckpt/checksum.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/core/error.h"
#include "shardwise/models/custom.h"

namespace shardwise::train {

ckpt::KeyMap gpt2_key_map(const GptConfig& c) {
  ckpt::KeyMap m;
  const int64_t H = c.hidden;
  const char* parts[] = {"q_proj", "k_proj", "v_proj"};
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string attn = fmt::format("transformer.h.{}.attn.", l);
    for (int64_t i = 0; i < 3; ++i) {
      const std::string p = attn + parts[i];
      m.place(p + ".weight", Shape{H, H}, attn + "c_attn.weight", Shape{H, 3 * H}, {0, i * H});
      m.place(p + ".bias", Shape{H}, attn + "c_attn.bias", Shape{3 * H}, {i * H});
    }
  }
  return m;
}

ckpt::KeyMap model_key_map(const GptConfig& c) {
  if (c.custom) return {};  // a model written in Python: its parameters' own names
  if (c.is_llama()) return c.experts > 0 ? mixtral_key_map(c) : ckpt::KeyMap();
  return gpt2_key_map(c);
}

bool is_llama_model_type(const std::string& t) {
  return t == "llama" || t == "mixtral" || t == "shardwise_mixtral" || t == "qwen2" || t == "qwen3" || t == "mistral";
}

SpecialTokens default_special_tokens(int64_t vocab) {
  const int64_t id = vocab <= 256 ? 10 : std::min<int64_t>(50256, vocab - 1);
  return {id, id, id};
}

nlohmann::json with_tokens_and_dtype(const SpecialTokens& t, DType stored, nlohmann::json config) {
  config["bos_token_id"] = t.bos;
  config["eos_token_id"] = t.eos;
  config["pad_token_id"] = t.pad;
  config["torch_dtype"] = stored == DType::BF16 ? "bfloat16" : stored == DType::F16 ? "float16" : "float32";
  return config;
}

namespace {
constexpr const char* kTokenFields[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
}  // namespace

StoredTokenIds read_stored_token_ids(const ckpt::fs::path& dir) {
  auto fields = [&](const char* name) {
    nlohmann::json out = nlohmann::json::object(), j = ckpt::load_json(dir, name);
    for (const char* key : kTokenFields)
      if (j.contains(key)) out[key] = j[key];
    return out;
  };
  StoredTokenIds t;
  t.config = fields("config.json");
  t.generation = ckpt::fs::exists(dir / "generation_config.json") ? fields("generation_config.json") : t.config;
  return t;
}

nlohmann::json with_stored_token_ids(nlohmann::json file, const nlohmann::json& stored,
                                     const std::vector<std::string>& keep) {
  for (const char* key : kTokenFields) {
    if (std::find(keep.begin(), keep.end(), key) != keep.end()) continue;
    if (stored.contains(key)) file[key] = stored[key];
    else file.erase(key);
  }
  return file;
}

nlohmann::json gpt2_config_json(const GptConfig& m, DType stored, const SpecialTokens& t) {
  return with_tokens_and_dtype(t, stored, {{"architectures", {"GPT2LMHeadModel"}},
                                          {"model_type", "gpt2"},
                                          {"n_layer", m.layers},
                                          {"n_head", m.heads},
                                          {"n_embd", m.hidden},
                                          {"n_inner", nullptr},  // 4 x n_embd
                                          {"n_positions", m.seq},
                                          {"n_ctx", m.seq},
                                          {"vocab_size", m.vocab},
                                          {"activation_function", "gelu_new"},
                                          {"layer_norm_epsilon", m.layer_norm_epsilon},
                                          {"initializer_range", m.init_std},
                                          {"resid_pdrop", m.dropout},
                                          {"embd_pdrop", m.dropout},
                                          {"attn_pdrop", m.dropout},
                                          {"scale_attn_weights", true},
                                          {"scale_attn_by_inverse_layer_idx", false},
                                          {"reorder_and_upcast_attn", false},
                                          {"tie_word_embeddings", true},
                                          {"use_cache", true}});
}

nlohmann::json generation_config_json(const GptConfig& m, const SpecialTokens& t) {
  return {{"bos_token_id", t.bos}, {"eos_token_id", t.eos}, {"pad_token_id", t.pad}, {"max_length", m.seq},
          {"do_sample", false}};
}

GptConfig read_model_config(const ckpt::fs::path& dir) {
  nlohmann::json j = ckpt::load_json(dir, "config.json");
  const std::string file = (dir / "config.json").string();
  const std::string type = j.value("model_type", "");
  if (is_llama_model_type(type)) return read_llama_config(j, file);
  SW_CHECK(type == "gpt2" || type == "shardwise_gpt",
           "'{}': model_type '{}' is not a model shardwise builds (gpt2, llama, mistral, mixtral, qwen2, "
           "qwen3, shardwise_mixtral, or the earlier shardwise_gpt)", file,
           type);
  auto field = [&](const char* key) {
    SW_CHECK(j.contains(key) && j[key].is_number_integer(), "'{}': config.json has no integer '{}'", file, key);
    return j[key].get<int64_t>();
  };
  GptConfig c;
  c.layers = field("n_layer");
  c.heads = field("n_head");
  c.hidden = field("n_embd");
  c.seq = field("n_positions");
  c.vocab = field("vocab_size");
  c.layer_norm_epsilon = j.value("layer_norm_epsilon", c.layer_norm_epsilon);
  c.init_std = j.value("initializer_range", c.init_std);
  // What GPT2LMHeadModel can be configured to do that this model does not.
  auto refuse_unless = [&](bool ok, const char* key, const std::string& want) {
    SW_CHECK(ok, "'{}': {} = {} is not supported (shardwise's GPT-2 has {})", file, key,
             j.contains(key) ? j[key].dump() : "(missing)", want);
  };
  if (j.contains("n_inner") && !j["n_inner"].is_null())
    refuse_unless(j["n_inner"] == 4 * c.hidden, "n_inner", fmt::format("4 x n_embd = {}", 4 * c.hidden));
  const std::string act = j.value("activation_function", "gelu_new");
  refuse_unless(act == "gelu_new" || act == "gelu_pytorch_tanh", "activation_function", "gelu_new (tanh GELU)");
  refuse_unless(j.value("tie_word_embeddings", true), "tie_word_embeddings", "the LM head tied to wte");
  refuse_unless(j.value("scale_attn_weights", true), "scale_attn_weights", "scores scaled by 1/sqrt(head_dim)");
  refuse_unless(!j.value("scale_attn_by_inverse_layer_idx", false), "scale_attn_by_inverse_layer_idx",
                "no per-layer scaling");
  c.validate();
  return c;
}

double stored_dropout(const ckpt::fs::path& dir) {
  const nlohmann::json j = ckpt::load_json(dir, "config.json");
  const std::string type = j.value("model_type", "");
  if (is_llama_model_type(type)) return j.value("attention_dropout", 0.0);
  const double absent = type == "gpt2" ? 0.1 : 0.0;
  const double resid = j.value("resid_pdrop", absent), embd = j.value("embd_pdrop", absent),
               attn = j.value("attn_pdrop", absent);
  SW_CHECK(resid == embd && embd == attn,
           "'{}': resid_pdrop {}, embd_pdrop {} and attn_pdrop {} differ; shardwise's GPT-2 drops out the embeddings, "
           "the attention probabilities and the residual branches with one probability: choose it with --dropout P",
           (dir / "config.json").string(), resid, embd, attn);
  return resid;
}

std::optional<bool> linear_weights_in_out(const ckpt::fs::path& dir) {
  if (!ckpt::fs::is_regular_file(dir / "config.json")) return std::nullopt;
  const std::string type = ckpt::load_json(dir, "config.json").value("model_type", "");
  if (type == "gpt2") return true;
  if (is_llama_model_type(type)) return false;
  return std::nullopt;
}

bool is_legacy_layout(const ckpt::fs::path& dir) {
  return ckpt::load_json(dir, "config.json").value("model_type", "") == "shardwise_gpt";
}

ckpt::KeyMap key_map_for(const ckpt::fs::path& dir, const GptConfig& config) {
  return is_legacy_layout(dir) ? ckpt::KeyMap() : model_key_map(config);
}

std::string model_fingerprint(const ckpt::fs::path& dir) {
  const bool masters = ckpt::GroupReader::exists(dir, "master_weights");
  std::vector<std::string> parts;
  for (const std::string& name : ckpt::GroupReader(dir, masters ? "master_weights" : "model").file_names()) {
    const ckpt::FileSample f = ckpt::sample_file(dir / name);
    parts.push_back(fmt::format("{}:{}:{}:{}", name, f.size, f.head_xxh64, f.tail_xxh64));
  }
  return fmt::format("{}", fmt::join(parts, ";"));
}

std::map<std::string, Tensor> load_model_weights(const ckpt::fs::path& dir, const GptConfig& config,
                                                 std::span<const ckpt::LoadSpec> specs, int64_t process,
                                                 const std::vector<std::string>& ignore_keys) {
  const bool masters = ckpt::fs::exists(dir / "master_weights.safetensors.index.json");
  ckpt::LoadOptions o;
  o.ignore_keys = ignore_keys;
  // transformers keeps the tied head out of its files, but older versions wrote it, and the causal
  // mask buffers (attn.bias, attn.masked_bias) and rotary inv_freq: none is a parameter here. An
  // untied Llama head is one.
  if (!config.is_llama() || config.tie_word_embeddings) o.ignore_keys.push_back("lm_head.weight");
  for (const char* k : {"transformer.h.*.attn.bias", "transformer.h.*.attn.masked_bias", "*.rotary_emb.inv_freq"})
    o.ignore_keys.push_back(k);
  o.convert_dtype = true;
  o.keys = key_map_for(dir, config);
  return ckpt::load_group(dir, masters ? "master_weights" : "model", specs, process, o);
}

}  // namespace shardwise::train
