#include "shardwise/models/lora.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <regex>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/models/gpt.h"

namespace shardwise::train {
namespace {

const char* kPrefix = "base_model.model.";

bool matches(const std::string& path, const std::string& target) {
  return path == target || (path.size() > target.size() && path.ends_with(target) &&
                            path[path.size() - target.size() - 1] == '.');
}

// The model's linear modules LoRA adapts, the modules a target may name that it does not (with
// the reason), and how the former read in an error.
struct ModelModules {
  std::vector<LoraModule> linear;
  std::vector<LoraModule> expert_params;  // a MoE layer's fused expert parameters (PEFT's target_parameters)
  std::vector<std::pair<std::string, std::string>> others;  // path, why it is not adapted
  std::string listing;
};

ModelModules gpt_modules(const GptConfig& c) {
  struct Kind {
    const char* suffix;
    int64_t in_mult, out_mult;  // x hidden
    bool column;
  };
  constexpr Kind kKinds[] = {{"attn.c_attn", 1, 3, true}, {"attn.c_proj", 1, 1, false}, {"mlp.c_fc", 1, 4, true},
                             {"mlp.c_proj", 4, 1, false}};
  ModelModules out;
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    for (const Kind& k : kKinds) {
      LoraModule m{fmt::format("transformer.h.{}.{}", layer, k.suffix), k.in_mult * c.hidden, k.out_mult * c.hidden,
                   k.column, {}, 0, {}};
      const std::string attn = fmt::format("transformer.h.{}.attn.", layer);
      if (std::string(k.suffix) == "attn.c_attn") m.parts = {attn + "q_proj", attn + "k_proj", attn + "v_proj"};
      else m.parts = {m.path};
      out.linear.push_back(std::move(m));
    }
  }
  for (const char* other : {"transformer.wte", "transformer.wpe", "lm_head", "transformer.ln_f", "transformer.h.0.ln_1",
                            "transformer.h.0.ln_2"}) {
    out.others.emplace_back(other, "the targets are GPT-2's linear layers c_attn, c_proj (attn and mlp) and c_fc");
  }
  out.listing = "c_attn, c_proj (attn.c_proj, mlp.c_proj) and c_fc in every layer (transformer.h.<i>.attn.c_attn, ...)";
  return out;
}

ModelModules llama_modules(const GptConfig& c) {
  const int64_t H = c.hidden, Q = c.heads * c.head_size(), KV = c.key_value_heads() * c.head_size(), I = c.mlp_width();
  const std::string why = "the targets are the linear layers q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and "
                          "down_proj (or all-linear)";
  const std::string moe = "a mixture-of-experts block, whose router and shared expert LoRA does not adapt, and whose "
                          "experts it adapts as PEFT does, through transformers' fused parameters: name "
                          "experts.gate_up_proj and experts.down_proj (PEFT's target_parameters)";
  ModelModules out;
  for (const char* other : {"model.embed_tokens", "lm_head", "model.norm"}) out.others.emplace_back(other, why);
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    auto add = [&](const std::string& name, int64_t in, int64_t n_out, bool column) {
      out.linear.push_back(LoraModule{p + name, in, n_out, column, {p + name}, 0, {}});
    };
    add("self_attn.q_proj", H, Q, true), add("self_attn.k_proj", H, KV, true), add("self_attn.v_proj", H, KV, true);
    add("self_attn.o_proj", Q, H, false);
    for (const char* norm : {"input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"})
      out.others.emplace_back(p + norm, why);
    if (!c.is_moe_layer(layer)) {
      add("mlp.gate_proj", H, I, true), add("mlp.up_proj", H, I, true), add("mlp.down_proj", I, H, false);
      continue;
    }
    const std::string experts = p + "mlp.experts";  // PEFT's ParamWrapper: B's parts are w1 | w3 and w2
    out.expert_params.push_back(LoraModule{experts, H, 2 * I, true, {experts + ".gate_up_proj.gate",
                                           experts + ".gate_up_proj.up"}, c.experts, experts + ".gate_up_proj"});
    out.expert_params.push_back(
        LoraModule{experts, I, H, false, {experts + ".down_proj"}, c.experts, experts + ".down_proj"});
    // transformers' names (mlp.*) and shardwise's (block_sparse_moe.*, its experts' w1, w2, w3).
    for (const char* block : {"mlp", "block_sparse_moe"}) {
      for (const char* part : {"gate", "experts", "experts.w1", "experts.w2", "experts.w3", "shared_expert.gate_proj",
                               "shared_expert.up_proj", "shared_expert.down_proj", "shared_expert_gate"})
        out.others.emplace_back(fmt::format("{}{}.{}", p, block, part), moe);
    }
  }
  out.listing = "self_attn.q_proj, k_proj, v_proj, o_proj and (dense layers) mlp.gate_proj, up_proj, down_proj in every "
                "layer (model.layers.<i>.self_attn.q_proj, ...)";
  return out;
}

void check_settings(const LoraConfig& l) {
  SW_CHECK(l.rank >= 1, "--lora-rank must be at least 1, got {}", l.rank);
  SW_CHECK(l.alpha != 0 && std::isfinite(l.alpha), "--lora-alpha must be a non-zero number, got {}", l.alpha);
  SW_CHECK(l.dropout >= 0 && l.dropout < 1, "--lora-dropout must be in [0, 1), got {}", l.dropout);
}

}  // namespace

double LoraConfig::scale() const {
  return alpha / (rslora ? std::sqrt(static_cast<double>(rank)) : static_cast<double>(rank));
}

bool LoraConfig::all_linear() const {
  if (targets.size() != 1 || !target_regex.empty()) return false;
  std::string t = targets[0];
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return t == "all-linear";
}

bool LoraConfig::targets_module(const std::string& path) const {
  if (!target_regex.empty()) return std::regex_match(path, std::regex(target_regex));
  for (const std::string& t : targets)
    if (matches(path, t)) return true;
  return false;
}

std::vector<std::string> lora_default_targets(const GptConfig& c) {
  if (c.is_llama()) return {"q_proj", "v_proj"};
  return {"c_attn"};
}

std::vector<LoraModule> lora_modules(const GptConfig& c) {
  LoraConfig l = c.lora;
  check_settings(l);
  if (l.targets.empty() && l.target_regex.empty()) l.targets = lora_default_targets(c);
  const ModelModules model = c.is_llama() ? llama_modules(c) : gpt_modules(c);
  if (l.all_linear()) {
    SW_CHECK(c.shared_expert_width == 0, "--lora-targets all-linear on a model with a shared expert: PEFT would adapt "
             "the shared expert's linear layers, which LoRA does not adapt here; name the targets (q_proj, k_proj, "
             "v_proj, o_proj)");
    return model.linear;
  }
  std::vector<LoraModule> out;
  for (const LoraModule& m : model.linear)
    if (l.targets_module(m.path)) out.push_back(m);
  std::vector<LoraModule> experts;
  for (const LoraModule& m : model.expert_params) {
    bool named = false;
    for (const std::string& t : l.targets) named = named || matches(m.parameter, t);
    if (named) experts.push_back(m);
  }
  for (const auto& [path, why] : model.others) {
    SW_CHECK(l.target_regex.empty() || !std::regex_match(path, std::regex(l.target_regex)),
             "target_modules '{}' matches '{}', which LoRA does not adapt here: {}", l.target_regex, path, why);
  }
  for (const std::string& t : l.targets) {
    bool any = false;
    for (const LoraModule& m : model.linear) any = any || matches(m.path, t);
    for (const LoraModule& m : experts) any = any || matches(m.parameter, t);
    if (any) continue;
    for (const auto& [path, why] : model.others)
      SW_CHECK(!matches(path, t), "--lora-targets '{}' names '{}', which LoRA does not adapt here: {}", t, path, why);
    fail("--lora-targets '{}' names no module of the model: its linear layers are {}", t, model.listing);
  }
  SW_CHECK(!out.empty() || !experts.empty(), "target_modules '{}' matches no module of the model: its linear layers "
           "are {}", l.target_regex, model.listing);
  SW_CHECK(experts.empty() || l.dropout == 0, "--lora-dropout {} with the experts' parameters as targets: PEFT's "
           "lora.ParamWrapper (target_parameters) refuses lora_dropout, which cannot be applied to a weight", l.dropout);
  for (LoraModule& m : experts) {  // PEFT wraps gate_up_proj first; down_proj's wrapper holds it as base_layer
    const bool both = std::count_if(experts.begin(), experts.end(), [&](const LoraModule& o) { return o.path == m.path; }) == 2;
    if (both && m.parameter.ends_with(".gate_up_proj")) m.path += ".base_layer";
  }
  out.insert(out.end(), experts.begin(), experts.end());
  return out;
}

namespace {

// The target entries that name expert parameters (lora_modules' target_parameters).
std::vector<std::string> expert_targets(const GptConfig& c) {
  std::vector<std::string> out;
  if (!c.lora.target_regex.empty() || c.lora.all_linear() || c.experts == 0) return out;
  const std::vector<LoraModule> experts = llama_modules(c).expert_params;
  for (const std::string& t : c.lora.targets) {
    if (std::any_of(experts.begin(), experts.end(), [&](const LoraModule& m) { return matches(m.parameter, t); }))
      out.push_back(t);
  }
  return out;
}

}  // namespace

nlohmann::json lora_target_parameters(const GptConfig& c) {
  const std::vector<std::string> targets = expert_targets(c);
  return targets.empty() ? nlohmann::json() : nlohmann::json(targets);
}

nlohmann::json lora_target_modules(const GptConfig& c) {
  const LoraConfig& l = c.lora;
  if (!l.target_regex.empty()) return l.target_regex;
  if (l.targets.empty()) return lora_default_targets(c);
  if (!l.all_linear()) {  // less the entries that name expert parameters only (down_proj may name both)
    const std::vector<std::string> experts = expert_targets(c);
    const std::vector<LoraModule> linear = c.is_llama() ? llama_modules(c).linear : std::vector<LoraModule>{};
    std::vector<std::string> modules;
    for (const std::string& t : l.targets) {
      const bool module = std::any_of(linear.begin(), linear.end(), [&](const LoraModule& m) { return matches(m.path, t); });
      if (module || std::find(experts.begin(), experts.end(), t) == experts.end()) modules.push_back(t);
    }
    return modules;
  }
  std::vector<std::string> paths;
  for (const LoraModule& m : lora_modules(c)) paths.push_back(m.path);
  return paths;
}

std::string lora_targets_text(const GptConfig& c) {
  const LoraConfig& l = c.lora;
  if (!l.target_regex.empty()) return l.target_regex;
  return fmt::format("{}", fmt::join(l.targets.empty() ? lora_default_targets(c) : l.targets, ", "));
}

std::string lora_a_name(const std::string& module_path) { return module_path + ".lora_A.weight"; }
std::string lora_b_name(const std::string& part_path) { return part_path + ".lora_B.weight"; }
bool is_lora_param(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

Tensor init_lora_block(const std::string& name, const Shape& shape, std::span<const int64_t> offset,
                       const Shape& block, uint64_t seed) {
  SW_CHECK(is_lora_param(name) && shape.ndim() == 2 && block.ndim() == 2, "'{}' {} is not a LoRA matrix", name,
           shape.to_string());
  Tensor t(DType::F32, block);  // B: zeros
  if (name.ends_with(".lora_B.weight")) return t;
  // kaiming_uniform_(a = sqrt(5)) on [r, in]: gain sqrt(2 / 6), bound gain * sqrt(3 / in) = 1 / sqrt(in).
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape[1]));
  Philox rng(seed, stream_id(name));
  float* p = t.data<float>();
  for (int64_t i = 0; i < block[0]; ++i) {
    for (int64_t j = 0; j < block[1]; ++j) {
      const auto global = static_cast<uint64_t>((offset[0] + i) * shape[1] + offset[1] + j);
      p[i * block[1] + j] = static_cast<float>(bound * (2.0 * rng.uniform(global) - 1.0));
    }
  }
  return t;
}

ckpt::KeyMap lora_key_map(const GptConfig& c) {
  ckpt::KeyMap keys;
  const int64_t r = c.lora.rank;
  for (const LoraModule& m : lora_modules(c)) {
    const int64_t rows_a = r * std::max<int64_t>(1, m.experts);  // experts: every expert's r rows of A, columns of B
    keys.place(lora_a_name(m.path), Shape{rows_a, m.in}, kPrefix + lora_a_name(m.path), Shape{rows_a, m.in}, {0, 0});
    const int64_t rows = m.out / static_cast<int64_t>(m.parts.size());
    for (size_t i = 0; i < m.parts.size(); ++i) {
      keys.place(lora_b_name(m.parts[i]), Shape{rows, rows_a}, kPrefix + lora_b_name(m.path), Shape{m.out, rows_a},
                 {static_cast<int64_t>(i) * rows, 0});
    }
  }
  return keys;
}

nlohmann::json adapter_config_json(const GptConfig& c, const std::string& base) {
  const LoraConfig& l = c.lora;
  nlohmann::json alpha = l.alpha;
  if (l.alpha == std::floor(l.alpha) && std::abs(l.alpha) < 1e15) alpha = static_cast<int64_t>(l.alpha);
  const nlohmann::json targets = lora_target_modules(c);
  // Every field PEFT 0.21's LoraConfig writes, in its order (json sorts the keys, as PEFT does).
  return {{"alora_invocation_tokens", nullptr}, {"alpha_pattern", nlohmann::json::object()},
          {"arrow_config", nullptr}, {"auto_mapping", nullptr},
          {"base_model_name_or_path", base.empty() ? nlohmann::json() : nlohmann::json(base)},
          {"bias", "none"}, {"corda_config", nullptr}, {"ensure_weight_tying", false}, {"eva_config", nullptr},
          {"exclude_modules", nullptr}, {"fan_in_fan_out", !c.is_llama()}, {"inference_mode", true},
          {"init_lora_weights", true}, {"kasa_config", nullptr}, {"layer_replication", nullptr},
          {"layers_pattern", nullptr}, {"layers_to_transform", nullptr}, {"loftq_config", nlohmann::json::object()},
          {"lora_alpha", alpha}, {"lora_bias", false}, {"lora_dropout", l.dropout}, {"lora_ga_config", nullptr},
          {"megatron_config", nullptr}, {"megatron_core", "megatron.core"}, {"modules_to_save", nullptr},
          {"monteclora_config", nullptr}, {"peft_type", "LORA"}, {"qalora_group_size", 16}, {"r", l.rank},
          {"rank_pattern", nlohmann::json::object()}, {"revision", nullptr}, {"target_modules", targets},
          {"target_parameters", lora_target_parameters(c)}, {"task_type", "CAUSAL_LM"}, {"trainable_token_indices", nullptr},
          {"use_bdlora", nullptr}, {"use_dora", false}, {"use_qalora", false}, {"use_rslora", l.rslora},
          {"velora_config", nullptr}};
}

LoraConfig read_adapter_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "adapter_config.json";
  SW_CHECK(std::filesystem::is_directory(dir), "--lora-from '{}' is not a directory", dir.string());
  std::ifstream in(file);
  SW_CHECK(in.good(), "--lora-from '{}' has no adapter_config.json (a PEFT adapter directory holds it and "
           "adapter_model.safetensors)", dir.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("'{}' is not valid JSON: {}", file.string(), e.what());
  }
  auto unset = [&](const char* key) { return !j.contains(key) || j[key].is_null() || (j[key].is_object() && j[key].empty()); };
  SW_CHECK(j.value("peft_type", "LORA") == "LORA", "'{}': peft_type '{}' is not LORA", file.string(),
           j.value("peft_type", ""));
  for (const char* key : {"rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform", "layers_pattern",
                          "exclude_modules", "trainable_token_indices", "layer_replication"})
    SW_CHECK(unset(key), "'{}' sets {} = {}, which shardwise's LoRA does not support", file.string(), key, j[key].dump());
  for (const char* key : {"use_dora", "lora_bias", "use_qalora"})
    SW_CHECK(!j.value(key, false), "'{}' sets {} = true, which shardwise's LoRA does not support", file.string(), key);
  SW_CHECK(j.value("bias", "none") == "none", "'{}': bias '{}': only \"none\" (biases stay frozen) is supported",
           file.string(), j.value("bias", ""));
  SW_CHECK(j.contains("r") && j["r"].is_number_integer(), "'{}' has no integer r", file.string());
  LoraConfig l;
  l.rank = j["r"].get<int64_t>();
  l.alpha = j.value("lora_alpha", 8.0);
  l.rslora = j.value("use_rslora", false);
  l.dropout = j.value("lora_dropout", 0.0);
  const nlohmann::json& t = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
  SW_CHECK(t.is_array() || t.is_string(), "'{}': target_modules must be a list of module names or a regex",
           file.string());
  if (t.is_array()) {
    l.targets = t.get<std::vector<std::string>>();
  } else {  // PEFT's string form: the "all-linear" shorthand, else a regex
    l.targets = {t.get<std::string>()};
    if (!l.all_linear()) l.targets.clear(), l.target_regex = t.get<std::string>();
  }
  if (!unset("target_parameters") && !(j["target_parameters"].is_array() && j["target_parameters"].empty())) {
    // the experts' fused parameters: one target list here
    SW_CHECK(j["target_parameters"].is_array() && l.target_regex.empty() && !l.all_linear(), "'{}': target_parameters "
             "{} with target_modules {}: shardwise reads a list of parameters beside a list of modules",
             file.string(), j["target_parameters"].dump(), t.dump());
    for (const std::string& p : j["target_parameters"].get<std::vector<std::string>>()) l.targets.push_back(p);
  }
  return l;
}

}  // namespace shardwise::train
