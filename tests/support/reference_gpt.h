#pragma once
// A plain reference for the trainer tests: GPT-2's forward in double, one sequence at a time, written
// from the model's definition (not from the graph builder): token + position embeddings, pre-LayerNorm
// blocks with causal attention and a tanh-GELU MLP, the final LayerNorm, the head tied to wte.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "shardwise/models/models.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train::reference {

using Params = std::map<std::string, std::vector<double>>;
using Rows = std::vector<std::vector<double>>;  // [positions][features]

// Every parameter of the model, whole, on every rank (collective: every rank calls it). The names
// come from the single-device graph (GPT-2's or Llama's): with pp a rank holds only its stages' parameters.
inline Params whole_params(Trainer& t) {
  Params p;
  const GptGraph model = build_model(t.config().model, Strategy{}, 1);
  for (graph::ValueId v : model.g.params()) {
    const std::string& name = model.g.value(v).name;
    Tensor whole = t.gather_param(name);
    p[name].assign(whole.data<float>(), whole.data<float>() + whole.numel());
  }
  return p;
}

inline Rows layer_norm(const Rows& x, const Params& p, const std::string& name, double eps) {
  const std::vector<double>&w = p.at(name + ".weight"), &b = p.at(name + ".bias");
  Rows y = x;
  for (auto& row : y) {
    double mean = 0, var = 0;
    for (double v : row) mean += v;
    mean /= static_cast<double>(row.size());
    for (double v : row) var += (v - mean) * (v - mean);
    var /= static_cast<double>(row.size());
    for (size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  }
  return y;
}

// x [S, n_in] times weight [n_in, n_out] plus bias.
inline Rows linear(const Rows& x, const Params& p, const std::string& name) {
  const std::vector<double>&w = p.at(name + ".weight"), &b = p.at(name + ".bias");
  const size_t n_in = x[0].size(), n_out = b.size();
  Rows y(x.size(), std::vector<double>(n_out));
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t j = 0; j < n_out; ++j) {
      double s = b[j];
      for (size_t i = 0; i < n_in; ++i) s += x[t][i] * w[i * n_out + j];
      y[t][j] = s;
    }
  return y;
}

// Causal attention; with kv_heads < heads (grouped-query) q head h reads kv head h / (heads / kv_heads).
inline Rows causal_attention(const Rows& q, const Rows& k, const Rows& v, int64_t heads, int64_t kv_heads = 0) {
  const size_t S = q.size(), H = q[0].size(), hd = H / static_cast<size_t>(heads);
  const size_t group = kv_heads > 0 ? static_cast<size_t>(heads / kv_heads) : 1;
  Rows ctx(S, std::vector<double>(H, 0.0));
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h)
    for (size_t t = 0; t < S; ++t) {
      const size_t g = h / group;  // the kv head
      std::vector<double> score(t + 1);
      double mx = -1e300, sum = 0;
      for (size_t u = 0; u <= t; ++u) {
        double s = 0;
        for (size_t d = 0; d < hd; ++d) s += q[t][h * hd + d] * k[u][g * hd + d];
        score[u] = s / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, score[u]);
      }
      for (double& s : score) sum += (s = std::exp(s - mx));
      for (size_t u = 0; u <= t; ++u)
        for (size_t d = 0; d < hd; ++d) ctx[t][h * hd + d] += score[u] / sum * v[u][g * hd + d];
    }
  return ctx;
}

// The summed cross-entropy of the final hidden rows x [S, H] against tokens[1, S], logits x head^T
// (head [V, H]).
inline double next_token_loss(const Rows& x, const std::vector<double>& head, const std::vector<int64_t>& tokens) {
  const size_t H = x[0].size(), V = head.size() / H;
  double total = 0;
  for (size_t t = 0; t < x.size(); ++t) {
    std::vector<double> logits(V, 0.0);
    double mx = -1e300, sum = 0;
    for (size_t v = 0; v < V; ++v) {
      for (size_t i = 0; i < H; ++i) logits[v] += x[t][i] * head[v * H + i];
      mx = std::max(mx, logits[v]);
    }
    for (double z : logits) sum += std::exp(z - mx);
    total += mx + std::log(sum) - logits[static_cast<size_t>(tokens[t + 1])];
  }
  return total;
}

// The summed next-token cross-entropy of one sequence of n + 1 tokens (n <= seq): inputs
// tokens[0, n) at positions 0..n-1, labels tokens[1, n].
inline double sequence_loss(const std::vector<int64_t>& tokens, const Params& p, const GptConfig& c) {
  const size_t S = tokens.size() - 1, H = static_cast<size_t>(c.hidden);
  const std::vector<double>&wte = p.at("transformer.wte.weight"), &wpe = p.at("transformer.wpe.weight");
  Rows x(S, std::vector<double>(H));
  for (size_t t = 0; t < S; ++t)
    for (size_t i = 0; i < H; ++i) x[t][i] = wte[static_cast<size_t>(tokens[t]) * H + i] + wpe[t * H + i];
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "transformer.h." + std::to_string(l);
    Rows h = layer_norm(x, p, b + ".ln_1", c.layer_norm_epsilon);
    Rows a = linear(causal_attention(linear(h, p, b + ".attn.q_proj"), linear(h, p, b + ".attn.k_proj"),
                                     linear(h, p, b + ".attn.v_proj"), c.heads),
                    p, b + ".attn.c_proj");
    for (size_t t = 0; t < S; ++t)
      for (size_t i = 0; i < H; ++i) x[t][i] += a[t][i];
    Rows f = linear(layer_norm(x, p, b + ".ln_2", c.layer_norm_epsilon), p, b + ".mlp.c_fc");
    for (auto& row : f)
      for (double& u : row) u = 0.5 * u * (1 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
    Rows m = linear(f, p, b + ".mlp.c_proj");
    for (size_t t = 0; t < S; ++t)
      for (size_t i = 0; i < H; ++i) x[t][i] += m[t][i];
  }
  x = layer_norm(x, p, "transformer.ln_f", c.layer_norm_epsilon);
  return next_token_loss(x, wte, tokens);
}

}  // namespace shardwise::train::reference
