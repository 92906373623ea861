#include "shardwise/train/gpt.h"

#include <cmath>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/train/llama.h"

namespace shardwise::train {

void GptConfig::validate() const {
  SW_CHECK(layers >= 1, "layers must be at least 1, got {}", layers);
  SW_CHECK(heads >= 1 && hidden >= 1 && hidden % heads == 0,
           "hidden size {} must be a positive multiple of the number of heads {}", hidden, heads);
  SW_CHECK(seq >= 1, "sequence length must be at least 1, got {}", seq);
  SW_CHECK(vocab >= 2, "vocabulary must hold at least 2 tokens, got {}", vocab);
  SW_CHECK(dropout >= 0 && dropout < 1, "dropout must be in [0, 1), got {}", dropout);
  SW_CHECK(model_type == "gpt2" || model_type == "llama", "model '{}' is not one shardwise builds (gpt2, llama)",
           model_type);
  if (is_llama()) validate_llama(*this);
}

Strategy Strategy::from_mesh(const mesh::ProcessMesh& mesh, bool sequence_parallel) {
  Strategy s;
  s.mesh = mesh;
  s.sequence_parallel = sequence_parallel;
  const auto& names = mesh.dim_names();
  for (int m = 0; m < mesh.ndim(); ++m) {
    std::string n = names.empty() ? "" : names[static_cast<size_t>(m)];
    if (n == "dp") s.dp = m;
    else if (n == "tp") s.tp = m;
    else if (n == "pp") s.pp = m;
    else
      fail("mesh {}: dim {} is named '{}'; name every dim dp, tp or pp (e.g. dp=2,tp=2)", mesh.to_string(), m,
           n.empty() ? "(unnamed)" : n);
  }
  SW_CHECK(!sequence_parallel || s.tp >= 0, "sequence parallelism (--sp) runs on the tp dim: the mesh {} has none",
           mesh.to_string());
  return s;
}

std::string Strategy::to_string() const {
  return fmt::format("mesh {}{}", mesh.to_string(), sequence_parallel ? " + sequence parallel" : "");
}

namespace {

// "S(1)" on the tp dim, `other` on dp, R elsewhere.
std::string placements(const Strategy& s, const char* on_tp, const char* on_dp = "R") {
  std::vector<std::string> parts(static_cast<size_t>(s.mesh.ndim()), "R");
  if (s.tp >= 0) parts[static_cast<size_t>(s.tp)] = on_tp;
  if (s.dp >= 0) parts[static_cast<size_t>(s.dp)] = on_dp;
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace

GptGraph build_gpt(const GptConfig& c, const Strategy& s, int64_t sequences, bool training, const GptPart& part) {
  c.validate();
  SW_CHECK(sequences >= 1, "a micro-batch must hold at least 1 sequence, got {}", sequences);
  SW_CHECK(c.heads % s.tp_size() == 0, "{} heads do not divide over tp={} (each tp rank needs whole heads)", c.heads,
           s.tp_size());
  SW_CHECK(sequences % s.dp_size() == 0, "a micro-batch of {} sequences does not divide over dp={}", sequences,
           s.dp_size());
  const int64_t B = sequences, S = c.seq, H = c.hidden, NH = c.heads, HD = H / NH, V = c.vocab;
  GptGraph out;
  out.sequences = sequences;
  graph::Graph& g = out.g;
  auto annotate = [&](graph::ValueId v, const std::string& p) {
    if (s.mesh.ndim() > 0) g.annotate(v, p);
  };
  const std::string boundary = placements(s, s.sequence_parallel ? "S(1)" : "R", "S(0)");  // between stages
  // A parameter as stored (f32, or bf16 with fp32 masters kept by the optimizer) and as the
  // kernels read it: bf16 parameters are cast to f32 right away, so every kernel computes in f32
  // and the gradient flows back through the cast into a bf16 gradient.
  auto param = [&](const std::string& name, const Shape& shape, const char* on_tp = nullptr) {
    auto v = g.param(name, shape, c.param_dtype);
    if (on_tp && s.tp >= 0) annotate(v, placements(s, on_tp));
    if (c.param_dtype == DType::F32) return v;
    return g.op1("cast", {v}, {{"dtype", std::string("f32")}}, name + ".f32");
  };
  // Dropout at a named site (its own random stream); the identity when not training or p = 0.
  auto drop = [&](graph::ValueId v, const std::string& site) {
    if (c.dropout <= 0 || !training) return v;
    Attrs a{{"p", c.dropout},
            {"seed", static_cast<int64_t>(c.dropout_seed)},
            {"stream", static_cast<int64_t>(stream_id(site) >> 1)},
            {"training", true}};
    return g.op("dropout", {v}, a, site)[0];
  };
  graph::ValueId x, wte = -1;
  if (part.embeddings) {
    auto ids = g.input("ids", Shape{B, S}, DType::I64);
    annotate(ids, placements(s, "R", "S(0)"));
    wte = param("transformer.wte.weight", Shape{V, H}, "S(0)");
    auto wpe = param("transformer.wpe.weight", Shape{S, H});
    auto emb = g.add(g.embedding(ids, wte, "tok_emb"), wpe, "emb");
    if (s.sequence_parallel) annotate(emb, placements(s, "S(1)", "S(0)"));  // reduce-scattered onto the sequence
    x = drop(emb, "emb.dropout");
  } else {
    out.input = x = g.input("stage_input", Shape{B, S, H});
    g.value(x).requires_grad = training;
    annotate(x, boundary);
  }
  auto mask = g.input("causal_mask", Shape{S, S});
  annotate(mask, placements(s, "R"));

  auto ln = [&](graph::ValueId in, const std::string& name) {
    auto w = param(name + ".weight", Shape{H});
    auto b = param(name + ".bias", Shape{H});
    auto y = g.layer_norm(in, w, b, -1, c.layer_norm_epsilon, name + ".out");
    if (s.sequence_parallel) annotate(y, placements(s, "R", "S(0)"));  // gathered before the column-parallel matmuls
    return y;
  };
  // tp_kind: "col" (weight S(1), bias S(0) on tp), "row" (weight S(0), output resharded per sp).
  auto linear = [&](graph::ValueId in, const std::string& name, int64_t n_in, int64_t n_out, bool column) {
    auto w = param(name + ".weight", Shape{n_in, n_out}, column ? "S(1)" : "S(0)");
    auto b = param(name + ".bias", Shape{n_out}, column ? "S(0)" : nullptr);
    auto mm = g.matmul(in, w, false, name + ".mm");
    if (!column && s.sequence_parallel) annotate(mm, placements(s, "S(1)", "S(0)"));  // reduce-scatter onto the sequence
    return g.add(mm, b, name + ".out");
  };
  const int64_t end_layer = part.end_layer < 0 ? c.layers : part.end_layer;
  SW_CHECK(0 <= part.first_layer && part.first_layer <= end_layer && end_layer <= c.layers,
           "layers [{}, {}) are not a range of the model's {} layers", part.first_layer, end_layer, c.layers);
  for (int64_t l = part.first_layer; l < end_layer; ++l) {
    std::string p = fmt::format("transformer.h.{}", l);
    auto h = ln(x, p + ".ln_1");
    auto heads = [&](graph::ValueId t, const std::string& name) {
      return g.transpose(g.reshape(t, {B, S, NH, HD}, name + ".split"), {0, 2, 1, 3}, name + ".heads");
    };
    auto q = heads(linear(h, p + ".attn.q_proj", H, H, true), p + ".attn.q");
    auto k = heads(linear(h, p + ".attn.k_proj", H, H, true), p + ".attn.k");
    auto v = heads(linear(h, p + ".attn.v_proj", H, H, true), p + ".attn.v");
    // q is scaled by 1/sqrt(head dim) before q k^T rather than the [S, S] scores after it: a
    // quarter of the elements for S = 4 HD, and the same numbers when the factor is a power of 2.
    auto q_scaled = g.scale(q, 1.0 / std::sqrt(static_cast<double>(HD)), 0.0, p + ".attn.q.scaled");
    auto scores = g.matmul(q_scaled, k, true, p + ".attn.scores");
    auto probs = drop(g.softmax(g.add(scores, mask, p + ".attn.masked"), -1, p + ".attn.probs"), p + ".attn.dropout");
    auto ctx = g.reshape(g.transpose(g.matmul(probs, v, false, p + ".attn.ctx.heads"), {0, 2, 1, 3}, p + ".attn.ctx.t"),
                         {B, S, H}, p + ".attn.ctx");
    x = g.add(x, drop(linear(ctx, p + ".attn.c_proj", H, H, false), p + ".attn.resid_dropout"), p + ".attn.residual");
    auto h2 = ln(x, p + ".ln_2");
    auto m = linear(g.gelu(linear(h2, p + ".mlp.c_fc", H, 4 * H, true), p + ".mlp.act"), p + ".mlp.c_proj", 4 * H, H,
                    false);
    x = g.add(x, drop(m, p + ".mlp.dropout"), p + ".mlp.residual");
  }
  if (!part.head) {
    annotate(x, boundary);
    out.output = x;
    out.output_grad = g.input(g.value(x).name + "@grad_in", Shape{B, S, H});
    annotate(out.output_grad, boundary);
    return out;
  }
  if (wte < 0) wte = param("transformer.wte.weight", Shape{V, H}, "S(0)");  // tied head: the last stage's copy
  auto logits = g.matmul(ln(x, "transformer.ln_f"), wte, true, "logits");
  if (!training) {
    out.predictions = g.op1("argmax", {logits}, {{"axis", int64_t{-1}}}, "predictions");
    return out;
  }
  auto labels = g.input("labels", Shape{B, S}, DType::I64);
  annotate(labels, placements(s, "R", "S(0)"));
  // Mean over every token as sum / (B * S): a sum keeps the batch sharded (its rule gives a Partial
  // loss over dp), where "mean" would need the whole batch on every rank; no label is ignored.
  // With tp the logits stay sharded on the vocabulary (Megatron's vocab-parallel cross-entropy).
  auto total = g.op1(s.tp >= 0 ? "vocab_parallel_cross_entropy" : "cross_entropy", {logits, labels},
                     {{"reduction", std::string("sum")}}, "loss_sum");
  out.loss_sum = total;
  out.loss = g.scale(total, 1.0 / static_cast<double>(B * S), 0.0, "loss");
  return out;
}

Tensor init_param(const GptConfig& c, const std::string& name, const Shape& shape, uint64_t seed) {
  std::vector<int64_t> zeros(static_cast<size_t>(shape.ndim()), 0);
  return init_param_block(c, name, shape, zeros, shape, seed);
}

Tensor init_param_block(const GptConfig& c, const std::string& name, const Shape& shape,
                        std::span<const int64_t> offset, const Shape& block, uint64_t seed) {
  Tensor t(DType::F32, block);
  bool is_ln = name.find(".ln_") != std::string::npos;
  if (name.ends_with(".bias")) return t;
  if (is_ln) return Tensor::full(DType::F32, block, 1.0);
  double std = c.init_std;
  if (name.ends_with("c_proj.weight")) std /= std::sqrt(2.0 * static_cast<double>(c.layers));
  Philox rng(seed, stream_id(name));
  float* p = t.data<float>();
  // Element j of the block is the global element at offset + its coordinates (row-major index).
  std::vector<int64_t> coord(static_cast<size_t>(block.ndim()), 0);
  for (int64_t j = 0; j < t.numel(); ++j) {
    uint64_t global = 0;
    for (int d = 0; d < shape.ndim(); ++d) global = global * static_cast<uint64_t>(shape[d]) + static_cast<uint64_t>(offset[static_cast<size_t>(d)] + coord[static_cast<size_t>(d)]);
    p[j] = static_cast<float>(std * rng.normal(global));
    for (int d = block.ndim() - 1; d >= 0; --d) {
      if (++coord[static_cast<size_t>(d)] < block[d]) break;
      coord[static_cast<size_t>(d)] = 0;
    }
  }
  return t;
}

Tensor causal_mask(int64_t seq) {
  Tensor t(DType::F32, Shape{seq, seq});
  float* p = t.data<float>();
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t j = 0; j < seq; ++j) p[i * seq + j] = j <= i ? 0.0f : -1e9f;
  return t;
}

}  // namespace shardwise::train
