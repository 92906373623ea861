#include "shardwise/models/gpt.h"

#include <cmath>
#include <map>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/mesh/cp_order.h"
#include "shardwise/models/compute.h"
#include "shardwise/models/llama.h"

namespace shardwise::train {

namespace {

// GPT-2 has no grouped-query attention, SwiGLU width, rotary base or RMSNorm: a run that sets one of
// Llama's fields on GPT-2 would train another model than it asked for, so it is refused by name.
void refuse_llama_only_fields(const GptConfig& c) {
  SW_CHECK(c.kv_heads == 0 || c.kv_heads == c.heads, "--kv-heads {}: GPT-2's attention has as many key/value heads "
           "as heads ({}); grouped-query attention is built for --model llama only", c.kv_heads, c.heads);
  SW_CHECK(c.intermediate_size == 0 || c.intermediate_size == 4 * c.hidden, "--intermediate-size {}: GPT-2's MLP is "
           "4 x hidden = {} wide (transformers' n_inner); an MLP width of its own is built for --model llama only",
           c.intermediate_size, 4 * c.hidden);
  const GptConfig defaults;
  SW_CHECK(c.rope_theta == defaults.rope_theta, "--rope-theta {}: GPT-2 has learned positions (wpe), no rotary "
           "embedding; rotary positions are built for --model llama only", c.rope_theta);
  SW_CHECK(c.rms_norm_eps == defaults.rms_norm_eps, "--rms-norm-eps {}: GPT-2 normalises with LayerNorm "
           "(layer_norm_epsilon {}); RMSNorm is built for --model llama only", c.rms_norm_eps, c.layer_norm_epsilon);
}

}  // namespace

void GptConfig::validate() const {
  SW_CHECK(layers >= 1, "layers must be at least 1, got {}", layers);
  SW_CHECK(heads >= 1 && hidden >= 1 && hidden % heads == 0,
           "hidden size {} must be a positive multiple of the number of heads {}", hidden, heads);
  SW_CHECK(seq >= 1, "sequence length must be at least 1, got {}", seq);
  SW_CHECK(vocab >= 2, "vocabulary must hold at least 2 tokens, got {}", vocab);
  SW_CHECK(dropout >= 0 && dropout < 1, "dropout must be in [0, 1), got {}", dropout);
  SW_CHECK(compute_dtype == DType::F32 || compute_dtype == DType::BF16,
           "--compute {}: the GEMMs and attention compute in f32 or bf16 (f32 accumulation)", dtype_name(compute_dtype));
  SW_CHECK(model_type == "gpt2" || model_type == "llama", "model '{}' is not one shardwise builds (gpt2, llama)",
           model_type);
  if (is_llama()) validate_llama(*this);
  SW_CHECK(tie_word_embeddings || is_llama(), "--untied-head: GPT-2's LM head is the token embedding (wte), as in "
           "transformers' GPT2LMHeadModel; a separate lm_head.weight is built for --model llama only");
  SW_CHECK(head_dim == 0 || is_llama(), "--head-dim {}: GPT-2's heads are hidden / heads wide (transformers' GPT2 "
           "has no head_dim); a head width of its own is built for --model llama only", head_dim);
  SW_CHECK(experts == 0 || is_llama(), "--experts {}: mixture-of-experts layers are built for --model llama only",
           experts);
  if (!is_llama()) refuse_llama_only_fields(*this);
  if (lora.rank != 0) lora_modules(*this);  // LoRA's checks (rank < 0 included)
  SW_CHECK(lm_head == "fused" || lm_head == "unfused", "--lm-head '{}' is not a head (fused, unfused)", lm_head);
  SW_CHECK(recompute == "none" || recompute == "full" || recompute == "selective",
           "--recompute '{}' is not a recompute mode (none, full, selective)", recompute);
  SW_CHECK(recompute_layers == -1 || recompute_layers >= 1,
           "--recompute-layers must be at least 1 (the first N layers of each stage; default: all), got {}",
           recompute_layers);
  SW_CHECK(recompute_layers == -1 || recompute != "none",
           "--recompute-layers {} needs --recompute full or selective (it is none)", recompute_layers);
  SW_CHECK(attention == "fused" || attention == "unfused", "--attention '{}' is not an attention mode (fused, unfused)",
           attention);
  SW_CHECK(cp_attention == "ring" || cp_attention == "gather",
           "--cp-attention '{}' is not a context-parallel attention (ring, gather)", cp_attention);
}

graph::ValueId dropout_at(graph::Graph& g, const GptConfig& c, bool training, graph::ValueId v, const std::string& site,
                          double p) {
  if (p <= 0 || !training) return v;
  Attrs a{{"p", p},
          {"seed", static_cast<int64_t>(c.dropout_seed)},
          {"stream", static_cast<int64_t>(stream_id(site) >> 1)},
          {"training", true}};
  return g.op("dropout", {v}, a, site)[0];
}

graph::ValueId unfused_attention(graph::Graph& g, const GptConfig& c, bool training, graph::ValueId q, graph::ValueId k,
                                 graph::ValueId v, graph::ValueId mask, const std::string& prefix, bool selective) {
  auto q_scaled = g.scale(q, 1.0 / std::sqrt(static_cast<double>(c.head_size())), 0.0, prefix + ".q.scaled");
  if (selective) g.begin_segment();
  auto scores = compute_matmul(g, c, q_scaled, k, true, prefix + ".scores");
  auto masked = g.add(scores, mask, prefix + ".masked");
  auto probs = dropout_at(g, c, training, g.softmax(masked, -1, prefix + ".probs"), prefix + ".dropout", c.dropout);
  auto ctx_heads = compute_matmul(g, c, probs, v, false, prefix + ".ctx.heads");
  if (selective) g.end_segment();
  return ctx_heads;
}

graph::ValueId fused_attention(graph::Graph& g, const GptConfig& c, bool training, graph::ValueId q, graph::ValueId k,
                               graph::ValueId v, graph::ValueId doc, const std::string& name,
                               const std::string& dropout_site) {
  Attrs a{{"scale", 1.0 / std::sqrt(static_cast<double>(c.head_size()))}};
  if (c.cp_order > 1) a.set("balanced_ranks", c.cp_order);  // the sequence in cp's order
  if (training && c.dropout > 0) {
    a.set("p", c.dropout);
    a.set("seed", static_cast<int64_t>(c.dropout_seed));
    a.set("stream", static_cast<int64_t>(stream_id(dropout_site) >> 1));
  }
  std::vector<graph::ValueId> in{compute_operand(g, c, q), compute_operand(g, c, k), compute_operand(g, c, v)};
  if (doc >= 0) in.push_back(doc);
  const bool ring = c.cp_order > 1 && c.cp_attention == "ring";  // q, k, v stay sequence-sharded: k, v blocks travel the ring
  const char* op = ring ? (doc >= 0 ? "ring_attention_docs" : "ring_attention")
                        : (doc >= 0 ? "flash_attention_docs" : "flash_attention");
  if (!computes_bf16(c)) return g.op(op, std::move(in), std::move(a), name)[0];
  return compute_result(g, g.op(op, std::move(in), std::move(a), name + ".bf16")[0], name);
}

namespace {

// The pieces of the model on the graph builder; build_gpt strings them together.
class Builder {
 public:
  Builder(const GptConfig& c, const Strategy& s, bool training, graph::Graph& g) : c_(c), s_(s), training_(training), g_(g) {
    if (c.lora.enabled()) {
      for (LoraModule& m : lora_modules(c)) lora_[m.path] = std::move(m);
    }
  }

  void annotate(graph::ValueId v, const std::string& p) {
    if (s_.mesh.ndim() > 0) g_.annotate(v, p);
  }
  // A parameter as stored (f32, or bf16 with fp32 masters kept by the optimizer) and as the kernels
  // read it: bf16 parameters are cast to f32 right away, so every kernel computes in f32 and the
  // gradient flows back through the cast into a bf16 gradient. With LoRA the base is frozen.
  graph::ValueId param(const std::string& name, const Shape& shape, const char* on_tp = nullptr, bool trainable = true) {
    auto v = trainable ? g_.param(name, shape, c_.param_dtype) : g_.frozen(name, shape, c_.param_dtype);
    if (on_tp && s_.tp >= 0) annotate(v, s_.placements(on_tp));
    if (c_.param_dtype == DType::F32) return v;
    return g_.op1("cast", {v}, {{"dtype", std::string("f32")}}, name + ".f32");
  }
  graph::ValueId base_param(const std::string& name, const Shape& shape, const char* on_tp = nullptr) {
    return param(name, shape, on_tp, !c_.lora.enabled());
  }
  // Dropout with probability p at a named site (its own random stream); the identity when not
  // training or p = 0.
  graph::ValueId drop(graph::ValueId v, const std::string& site, double p) {
    return dropout_at(g_, c_, training_, v, site, p);
  }
  graph::ValueId drop(graph::ValueId v, const std::string& site) { return drop(v, site, c_.dropout); }

  // LoRA's s (x A^T) [.., r] of a targeted module (-1 when it is not adapted): computed once and
  // shared by the parts (c_attn's q, k and v). A is replicated for a column-parallel base (x is
  // whole on tp), sharded on its input dim for a row-parallel one (x is sharded there: the product
  // is Partial(sum) over tp, reduced with the base product's).
  graph::ValueId lora_hidden(graph::ValueId in, const std::string& module) {
    auto it = lora_.find(module);
    if (it == lora_.end()) return -1;
    const LoraModule& m = it->second;
    auto a = param(lora_a_name(module), Shape{c_.lora.rank, m.in}, m.column ? nullptr : "S(1)");
    auto x = drop(in, module + ".lora_dropout", c_.lora.dropout);
    auto u = g_.scale(compute_matmul(g_, c_, x, a, true, module + ".lora_A.out"), c_.lora.scale(), 0.0,
                      module + ".lora.scaled");
    // Row-parallel: reduced here, at r / in of the base product's size, so that u B^T is whole and
    // the sum with x W needs no second all-reduce, forward or backward.
    if (!m.column) annotate(u, s_.placements("R", "S(0)"));
    return u;
  }

  // x W (+ the adapter's u B^T when `lora` >= 0) + b. Column-parallel: W S(1) and b S(0) on tp, B
  // S(0) (its output dim); row-parallel: W S(0), the sum resharded per sp, B replicated.
  graph::ValueId linear(graph::ValueId in, const std::string& name, int64_t n_in, int64_t n_out, bool column,
                        graph::ValueId lora = -1) {
    auto w = base_param(name + ".weight", Shape{n_in, n_out}, column ? "S(1)" : "S(0)");
    auto b = base_param(name + ".bias", Shape{n_out}, column ? "S(0)" : nullptr);
    auto mm = compute_matmul(g_, c_, in, w, false, name + ".mm");
    if (!column && s_.sequence_parallel) annotate(mm, s_.placements("S(1)", "S(0)"));  // reduce-scatter onto the sequence
    if (lora >= 0) {  // a row-parallel adapter's product is whole (lora_hidden): sliced, or added before the reduce
      auto B = param(lora_b_name(name), Shape{n_out, c_.lora.rank}, column ? "S(0)" : nullptr);
      mm = g_.add(mm, compute_matmul(g_, c_, lora, B, true, name + ".lora_B.out"), name + ".mm+lora");
    }
    return g_.add(mm, b, name + ".out");
  }

  graph::ValueId layer_norm(graph::ValueId in, const std::string& name) {
    const int64_t H = c_.hidden;
    auto w = base_param(name + ".weight", Shape{H});
    auto b = base_param(name + ".bias", Shape{H});
    auto y = g_.layer_norm(in, w, b, -1, c_.layer_norm_epsilon, name + ".out");
    // Gathered before the column-parallel matmuls; where on_gathered casts it to bf16 first, on its
    // sequence shard (the shard the norm computed).
    if (s_.sequence_parallel) annotate(y, sp_norm_placements(g_, c_, s_, training_));
    return y;
  }


  // One transformer block on the residual stream x [B, S, H]; `index` among the stage's blocks
  // (which ones recompute).
  graph::ValueId block(graph::ValueId x, int64_t l, int64_t index, int64_t B, graph::ValueId mask) {
    const int64_t S = c_.seq, H = c_.hidden, NH = c_.heads, HD = H / NH;
    const bool full = training_ && c_.recompute_full(index), selective = training_ && c_.recompute_selective(index);
    if (full) g_.begin_segment();
    std::string p = fmt::format("transformer.h.{}", l);
    auto h = layer_norm(x, p + ".ln_1");
    auto heads = [&](graph::ValueId t, const std::string& name) {
      return g_.transpose(g_.reshape(t, {B, S, NH, HD}, name + ".split"), {0, 2, 1, 3}, name + ".heads");
    };
    auto qkv_lora = lora_hidden(h, p + ".attn.c_attn");
    auto qkv = on_gathered(g_, c_, s_, training_, h, false, [&](graph::ValueId x) {
      return std::vector<graph::ValueId>{linear(x, p + ".attn.q_proj", H, H, true, qkv_lora),
                                         linear(x, p + ".attn.k_proj", H, H, true, qkv_lora),
                                         linear(x, p + ".attn.v_proj", H, H, true, qkv_lora)};
    });
    auto q = heads(qkv[0], p + ".attn.q"), k = heads(qkv[1], p + ".attn.k"), v = heads(qkv[2], p + ".attn.v");
    graph::ValueId ctx_heads;
    if (c_.fused_attention()) {
      ctx_heads = fused_attention(g_, c_, training_, q, k, v, c_.document_mask ? mask : -1, p + ".attn.ctx.heads",
                                  p + ".attn.dropout");
    } else {
      ctx_heads = unfused_attention(g_, c_, training_, q, k, v, mask, p + ".attn", selective);
    }
    auto ctx = g_.reshape(g_.transpose(ctx_heads, {0, 2, 1, 3}, p + ".attn.ctx.t"), {B, S, H}, p + ".attn.ctx");
    const std::string proj = p + ".attn.c_proj";
    x = g_.add(x, drop(linear(ctx, proj, H, H, false, lora_hidden(ctx, proj)), p + ".attn.resid_dropout"),
               p + ".attn.residual");
    auto h2 = layer_norm(x, p + ".ln_2");
    const std::string fc = p + ".mlp.c_fc", mlp_proj = p + ".mlp.c_proj";
    auto fc_lora = lora_hidden(h2, fc);
    auto fc_out = on_gathered(g_, c_, s_, training_, h2, false, [&](graph::ValueId x) {
      return std::vector<graph::ValueId>{linear(x, fc, H, 4 * H, true, fc_lora)};
    });
    auto act = g_.gelu(fc_out[0], p + ".mlp.act");
    auto m = linear(act, mlp_proj, 4 * H, H, false, lora_hidden(act, mlp_proj));
    auto out = g_.add(x, drop(m, p + ".mlp.dropout"), p + ".mlp.residual");
    if (full) g_.end_segment();
    return out;
  }

 private:
  const GptConfig& c_;
  const Strategy& s_;
  bool training_;
  graph::Graph& g_;
  std::map<std::string, LoraModule> lora_;  // by module path
};

}  // namespace

GptGraph build_gpt(const GptConfig& c, const Strategy& s, int64_t sequences, bool training, const GptPart& part) {
  c.validate();
  SW_CHECK(s.ep < 0, "the mesh {} has an ep dim: experts split over ep are built for --model llama --experts E only",
           s.mesh.to_string());
  SW_CHECK(sequences >= 1, "a micro-batch must hold at least 1 sequence, got {}", sequences);
  SW_CHECK(c.heads % s.tp_size() == 0, "{} heads do not divide over tp={} (each tp rank needs whole heads)", c.heads,
           s.tp_size());
  SW_CHECK(sequences % s.data_size() == 0, "a micro-batch of {} sequences does not divide over dp={}", sequences,
           s.dp_size());
  const int64_t B = sequences, S = c.seq, H = c.hidden, V = c.vocab;
  GptGraph out;
  out.sequences = sequences;
  graph::Graph& g = out.g;
  Builder b(c, s, training, g);
  const std::string boundary = s.placements(s.sequence_parallel ? "S(1)" : "R", "S(0)");  // between stages
  graph::ValueId x, wte = -1;
  if (part.embeddings) {
    auto ids = g.input("ids", Shape{B, S}, DType::I64);
    b.annotate(ids, s.placements("R", "S(0)"));
    wte = b.base_param("transformer.wte.weight", Shape{V, H}, "S(0)");
    auto wpe = b.base_param("transformer.wpe.weight", Shape{S, H}, c.document_mask || c.cp_order > 1 ? "R" : nullptr);
    if (c.document_mask) {  // positions restart in every document: looked up per token
      auto positions = g.input("position_ids", Shape{B, S}, DType::I64);
      b.annotate(positions, s.placements("R", "S(0)"));
      wpe = g.embedding(positions, wpe, "pos_emb");
    } else if (c.cp_order > 1) {  // cp's order: each stored token's original position
      auto positions = g.input("positions", Shape{S}, DType::I64);
      b.annotate(positions, s.placements("R"));
      wpe = g.embedding(positions, wpe, "pos_emb");
    }
    auto emb = g.add(g.embedding(ids, wte, "tok_emb"), wpe, "emb");
    if (s.sequence_parallel) b.annotate(emb, s.placements("S(1)", "S(0)"));  // reduce-scattered onto the sequence
    x = b.drop(emb, "emb.dropout");
  } else {
    out.input = x = g.input("stage_input", Shape{B, S, H});
    g.value(x).requires_grad = training;
    b.annotate(x, boundary);
  }
  // One causal mask for every sequence, or (document_mask) one per sequence: [B, 1, S, S] broadcast over the heads;
  // fused attention needs no mask, only the document ids [B, S] of packed documents.
  graph::ValueId mask = -1;
  if (c.fused_attention()) {
    if (c.document_mask) mask = g.input("document_ids", Shape{B, S}, DType::I64);
  } else {
    mask = c.document_mask ? g.input("attention_mask", Shape{B, 1, S, S}) : g.input("causal_mask", Shape{S, S});
  }
  // (the unfused [B, 1, S, S] mask stays whole on cp: its dim 1 is the heads' broadcast)
  if (mask >= 0) b.annotate(mask, s.placements("R", c.document_mask ? "S(0)" : "R", c.fused_attention() ? nullptr : "R"));
  const int64_t end_layer = part.end_layer < 0 ? c.layers : part.end_layer;
  SW_CHECK(0 <= part.first_layer && part.first_layer <= end_layer && end_layer <= c.layers,
           "layers [{}, {}) are not a range of the model's {} layers", part.first_layer, end_layer, c.layers);
  for (int64_t l = part.first_layer; l < end_layer; ++l) x = b.block(x, l, l - part.first_layer, B, mask);
  if (!part.head) {
    b.annotate(x, boundary);
    out.output = x;
    out.output_grad = g.input(g.value(x).name + "@grad_in", Shape{B, S, H});
    b.annotate(out.output_grad, boundary);
    return out;
  }
  if (wte < 0) wte = b.base_param("transformer.wte.weight", Shape{V, H}, "S(0)");  // tied head: the last stage's copy
  head_loss(g, c, s, b.layer_norm(x, "transformer.ln_f"), wte, training, out);
  return out;
}

void head_loss(graph::Graph& g, const GptConfig& c, const Strategy& s, graph::ValueId x, graph::ValueId w,
               bool training, GptGraph& out, const std::string& loss_name) {
  const int64_t B = g.value(x).meta.shape[0], S = g.value(x).meta.shape[1];
  const bool fused = training && c.lm_head == "fused";
  graph::ValueId logits = fused ? -1 : compute_matmul(g, c, x, w, true, "logits");
  if (!training) {
    out.predictions = g.op1("argmax", {logits}, {{"axis", int64_t{-1}}}, "predictions");
    return;
  }
  auto labels = g.input("labels", Shape{B, S}, DType::I64);
  if (s.mesh.ndim() > 0) g.annotate(labels, s.placements("R", "S(0)"));
  // Mean over every token as sum / (B * S): a sum keeps the batch sharded (its rule gives a Partial
  // loss over dp), where "mean" would need the whole batch on every rank; no label is ignored.
  // With tp the vocabulary stays sharded (Megatron's vocab-parallel cross-entropy); fused, the
  // logits exist one chunk of rows at a time (ops/softmax/lm_head.h).
  const char* op = fused ? (s.tp >= 0 ? "vocab_parallel_lm_head_cross_entropy" : "lm_head_cross_entropy")
                         : (s.tp >= 0 ? "vocab_parallel_cross_entropy" : "cross_entropy");
  // Under bf16 compute the fused head reads bf16 h and W (its GEMMs on bf16 operands, f32
  // accumulation; ops/softmax/lm_head.h): its loss is f32, its gradients bf16, widened by the casts'
  // backward.
  std::vector<graph::ValueId> in = fused ? std::vector<graph::ValueId>{compute_operand(g, c, x), compute_operand(g, c, w), labels}
                                         : std::vector<graph::ValueId>{logits, labels};
  // Fused, the head's gradients for the dloss this scale gives it come out of its forward (extra
  // outputs "loss_sum:1", ":2"; only those of inputs that take a gradient: a frozen LoRA head none).
  const double scale = 1.0 / static_cast<double>(B * S);
  Attrs attrs{{"reduction", std::string("sum")}};
  const int64_t grads = (g.value(x).requires_grad ? 1 : 0) | (g.value(w).requires_grad ? 2 : 0);
  if (fused && c.head_grads_in_forward && grads != 0) attrs.set("forward_grads", grads), attrs.set("grad_scale", scale);
  auto total = g.op1(op, in, std::move(attrs), "loss_sum");
  out.loss_sum = total;
  out.loss = g.scale(total, scale, 0.0, loss_name);
}

Tensor init_param(const GptConfig& c, const std::string& name, const Shape& shape, uint64_t seed) {
  std::vector<int64_t> zeros(static_cast<size_t>(shape.ndim()), 0);
  return init_param_block(c, name, shape, zeros, shape, seed);
}

Tensor init_param_block(const GptConfig& c, const std::string& name, const Shape& shape,
                        std::span<const int64_t> offset, const Shape& block, uint64_t seed) {
  if (is_lora_param(name)) return init_lora_block(name, shape, offset, block, seed);
  Tensor t(DType::F32, block);
  bool is_ln = name.find(".ln_") != std::string::npos;
  if (name.ends_with(".bias")) return t;
  if (is_ln) return Tensor::full(DType::F32, block, 1.0);
  double std = c.init_std;
  if (name.ends_with("c_proj.weight")) std /= std::sqrt(2.0 * static_cast<double>(c.layers));
  return normal_param_block(name, shape, offset, block, seed, std);
}

Tensor normal_param_block(const std::string& name, const Shape& shape, std::span<const int64_t> offset,
                          const Shape& block, uint64_t seed, double std) {
  Tensor t(DType::F32, block);
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

Tensor causal_mask(int64_t seq, int64_t cp_order) {
  Tensor t(DType::F32, Shape{seq, seq});
  float* p = t.data<float>();
  const std::vector<int64_t> pos = mesh::cp_balanced_order(seq, cp_order);
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t j = 0; j < seq; ++j) p[i * seq + j] = pos[static_cast<size_t>(j)] <= pos[static_cast<size_t>(i)] ? 0.0f : -1e9f;
  return t;
}

}  // namespace shardwise::train
