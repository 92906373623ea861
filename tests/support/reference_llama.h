#pragma once
// A plain reference for the Llama trainer tests: LlamaForCausalLM's forward in double, one sequence
// at a time, written from the model's definition (not from the graph builder): token embeddings,
// pre-RMSNorm blocks (grouped-query causal attention with rotary positions 0..n-1 in the
// rotate_half convention, a SwiGLU MLP), the final RMSNorm, the head (lm_head, or the embedding
// when tied). Weights are nn.Linear's [out, in].
#include <cmath>
#include <string>
#include <vector>

#include "tests/support/reference_gpt.h"

namespace shardwise::train::reference {

inline Rows rms_norm(const Rows& x, const Params& p, const std::string& name, double eps) {
  const std::vector<double>& w = p.at(name + ".weight");
  Rows y = x;
  for (auto& row : y) {
    double ms = 0;
    for (double v : row) ms += v * v;
    ms /= static_cast<double>(row.size());
    for (size_t i = 0; i < row.size(); ++i) row[i] = row[i] / std::sqrt(ms + eps) * w[i];
  }
  return y;
}

// x [S, n_in] times weight [n_out, n_in] transposed (no bias).
inline Rows project(const Rows& x, const std::vector<double>& w) {
  const size_t n_in = x[0].size(), n_out = w.size() / n_in;
  Rows y(x.size(), std::vector<double>(n_out, 0.0));
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t j = 0; j < n_out; ++j)
      for (size_t i = 0; i < n_in; ++i) y[t][j] += x[t][i] * w[j * n_in + i];
  return y;
}

// Each head's halves (i, i + hd/2) of row t rotated by the angle t / theta^(2i / hd).
inline void rotate(Rows& x, size_t hd, double theta) {
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t h0 = 0; h0 < x[t].size(); h0 += hd)
      for (size_t i = 0; i < hd / 2; ++i) {
        const double a = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
        const double u = x[t][h0 + i], v = x[t][h0 + i + hd / 2];
        x[t][h0 + i] = u * std::cos(a) - v * std::sin(a);
        x[t][h0 + i + hd / 2] = v * std::cos(a) + u * std::sin(a);
      }
}

// The summed next-token cross-entropy of one sequence of n + 1 tokens (n <= seq): inputs
// tokens[0, n) at positions 0..n-1, labels tokens[1, n].
inline double llama_sequence_loss(const std::vector<int64_t>& tokens, const Params& p, const GptConfig& c) {
  const size_t S = tokens.size() - 1, H = static_cast<size_t>(c.hidden);
  const size_t hd = H / static_cast<size_t>(c.heads);
  const std::vector<double>& embed = p.at("model.embed_tokens.weight");
  Rows x(S, std::vector<double>(H));
  for (size_t t = 0; t < S; ++t)
    for (size_t i = 0; i < H; ++i) x[t][i] = embed[static_cast<size_t>(tokens[t]) * H + i];
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l);
    Rows h = rms_norm(x, p, b + ".input_layernorm", c.rms_norm_eps);
    Rows q = project(h, p.at(b + ".self_attn.q_proj.weight")), k = project(h, p.at(b + ".self_attn.k_proj.weight"));
    rotate(q, hd, c.rope_theta), rotate(k, hd, c.rope_theta);
    Rows a = project(causal_attention(q, k, project(h, p.at(b + ".self_attn.v_proj.weight")), c.heads,
                                      c.key_value_heads()),
                     p.at(b + ".self_attn.o_proj.weight"));
    for (size_t t = 0; t < S; ++t)
      for (size_t i = 0; i < H; ++i) x[t][i] += a[t][i];
    h = rms_norm(x, p, b + ".post_attention_layernorm", c.rms_norm_eps);
    Rows gate = project(h, p.at(b + ".mlp.gate_proj.weight")), up = project(h, p.at(b + ".mlp.up_proj.weight"));
    for (size_t t = 0; t < S; ++t)
      for (size_t j = 0; j < gate[t].size(); ++j) gate[t][j] = gate[t][j] / (1 + std::exp(-gate[t][j])) * up[t][j];
    Rows m = project(gate, p.at(b + ".mlp.down_proj.weight"));
    for (size_t t = 0; t < S; ++t)
      for (size_t i = 0; i < H; ++i) x[t][i] += m[t][i];
  }
  x = rms_norm(x, p, "model.norm", c.rms_norm_eps);
  const std::vector<double>& head = c.tie_word_embeddings ? embed : p.at("lm_head.weight");
  return next_token_loss(x, head, tokens);
}

}  // namespace shardwise::train::reference
