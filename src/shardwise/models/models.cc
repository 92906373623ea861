#include "shardwise/models/models.h"

#include <cstring>

#include <fmt/format.h>

#include "shardwise/core/plural.h"
#include "shardwise/models/custom.h"
#include "shardwise/models/llama.h"
#include "shardwise/models/llama_decode.h"

namespace shardwise::train {

GptGraph build_model(const GptConfig& c, const Strategy& s, int64_t sequences, bool training, const GptPart& part) {
  if (c.custom) return build_custom(c, s, sequences, training, part);
  return c.is_llama() ? build_llama(c, s, sequences, training, part) : build_gpt(c, s, sequences, training, part);
}

DecoderGraph build_model_prefill(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t length,
                                 const DecodePart& part) {
  return c.is_llama() ? build_llama_prefill(c, s, sequences, length, part)
                      : build_gpt_prefill(c, s, sequences, length, part);
}

DecoderGraph build_model_decode_step(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t cache_length,
                                     const DecodePart& part) {
  return c.is_llama() ? build_llama_decode_step(c, s, sequences, cache_length, part)
                      : build_gpt_decode_step(c, s, sequences, cache_length, part);
}

Tensor init_model_param_block(const GptConfig& c, const std::string& name, const Shape& shape,
                              std::span<const int64_t> offset, const Shape& block, uint64_t seed) {
  if (c.custom) return init_custom_block(c, name, shape, offset, block, seed);
  return c.is_llama() ? init_llama_param_block(c, name, shape, offset, block, seed)
                      : init_param_block(c, name, shape, offset, block, seed);
}

Tensor init_model_param(const GptConfig& c, const std::string& name, const Shape& shape, uint64_t seed) {
  std::vector<int64_t> zeros(static_cast<size_t>(shape.ndim()), 0);
  return init_model_param_block(c, name, shape, zeros, shape, seed);
}

std::string tied_embedding(const GptConfig& c) {
  if (c.custom) return c.custom->tied ? c.custom->tied() : "";
  if (!c.is_llama()) return "transformer.wte.weight";
  return c.tie_word_embeddings ? "model.embed_tokens.weight" : "";
}

int64_t layer_of_param(const GptConfig& c, const std::string& name) {
  const char* prefix = c.is_llama() ? "model.layers." : "transformer.h.";
  if (!name.starts_with(prefix)) return -1;
  return std::stoll(name.substr(std::strlen(prefix)));
}

bool is_last_stage_param(const GptConfig& c, const std::string& name) {
  if (!c.is_llama()) return name.starts_with("transformer.ln_f");
  return name.starts_with("model.norm.") || name.starts_with("lm_head.");
}

std::vector<std::string> model_constant_names(const GptConfig& c) {
  if (c.custom) {  // those its graph declared
    std::vector<std::string> names;
    for (const auto& [name, value] : c.custom->constants()) names.push_back(name);
    return names;
  }
  if (c.document_mask) return {};  // one mask and position ids per micro-batch (packing.h)
  // Positions: Llama's rotary; GPT-2's position embedding only in cp's order (a lookup).
  std::vector<std::string> out;
  if (!c.fused_attention()) out.push_back("causal_mask");
  if (c.is_llama() || c.cp_order > 1) out.push_back("positions");
  return out;
}

std::map<std::string, Tensor> model_constants(const GptConfig& c) {
  if (c.custom) return c.custom->constants();
  std::map<std::string, Tensor> out;
  for (const std::string& name : model_constant_names(c))
    out[name] = name == "causal_mask" ? causal_mask(c.seq, c.cp_order) : position_ids(c.seq, c.cp_order);
  return out;
}

double parameter_count(const GptConfig& m) {
  const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab), L = static_cast<double>(m.layers);
  if (!m.is_llama()) return L * (12 * h * h + 13 * h) + V * h + static_cast<double>(m.seq) * h + 2 * h;
  const double q = static_cast<double>(m.heads * m.head_size()), kv = static_cast<double>(m.key_value_heads() * m.head_size());
  const double I = static_cast<double>(m.mlp_width());
  // An MoE layer's MLP: the router [E, H], the stacked experts' w1, w3 [E, I, H] and w2 [E, H, I],
  // and a shared expert of width W (gate, up, down) with its gate [1, H]; a dense layer's: 3 H I.
  const double E = static_cast<double>(m.experts), W = static_cast<double>(m.shared_expert_width);
  const double moe_mlp = E * h + 3 * E * I * h + (W > 0 ? 3 * h * W + h : 0);
  double total = V * h * (m.tie_word_embeddings ? 1 : 2) + h;
  // Besides the two RMSNorms, Qwen3's q/k norms [head_dim] and Qwen2's q/k/v biases.
  const double norms = 2 * h + (qk_norm(m) ? 2 * static_cast<double>(m.head_size()) : 0) +
                       (m.qkv_bias() ? q + 2 * kv : 0);
  for (int64_t l = 0; l < m.layers; ++l)
    total += 2 * h * q + 2 * h * kv + norms + (m.is_moe_layer(l) ? moe_mlp : 3 * h * I);
  return total;
}

std::pair<std::string, double> largest_parameter(const GptConfig& m) {
  const double h = static_cast<double>(m.hidden), embedding = static_cast<double>(m.vocab) * h;
  const int64_t I = m.is_llama() ? m.mlp_width() : 4 * m.hidden;
  const double mlp = h * static_cast<double>(I);
  std::pair<std::string, double> out = {
      fmt::format("{} ({}x{})", m.is_llama() ? "model.embed_tokens.weight" : "transformer.wte.weight", m.vocab, m.hidden),
      embedding};
  if (m.is_llama() && m.experts > 0) {  // the stacked experts' w1 [E, I, H] of the first MoE layer
    int64_t layer = 0;
    while (!m.is_moe_layer(layer)) ++layer;
    const double experts = static_cast<double>(m.experts) * mlp;
    if (experts > out.second)  // also larger than a dense layer's gate_proj [I, H]
      return {fmt::format("model.layers.{}.block_sparse_moe.experts.w1 ({}x{}x{})", layer, m.experts, I, m.hidden), experts};
  }
  if (mlp < out.second) return out;
  if (m.is_llama()) return {fmt::format("model.layers.0.mlp.gate_proj.weight ({}x{})", I, m.hidden), mlp};
  return {fmt::format("transformer.h.0.mlp.c_fc.weight ({}x{})", m.hidden, I), mlp};
}

std::string describe_architecture(const GptConfig& m) {
  if (m.custom) return m.custom->description;
  if (!m.is_llama()) return "GPT";
  return fmt::format("Llama ({} kv heads, intermediate {}, rope theta {}, {} head)", m.key_value_heads(), m.mlp_width(),
                     m.rope_theta, m.tie_word_embeddings ? "tied" : "untied");
}

std::string describe_model(const GptConfig& m, bool heads) {
  if (m.custom && !m.custom->feeds.empty()) return m.custom->description;
  if (m.custom) return fmt::format("{}, seq {}, vocab {}", m.custom->description, m.seq, m.vocab);
  return fmt::format("{} {}, hidden {}{}, seq {}, vocab {}", describe_architecture(m), counted(m.layers, "layer"),
                     m.hidden, heads ? ", " + counted(m.heads, "head") : "", m.seq, m.vocab);
}

}  // namespace shardwise::train
