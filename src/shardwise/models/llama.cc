#include "shardwise/models/llama.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/mesh/cp_order.h"
#include "shardwise/models/compute.h"
#include "shardwise/ops/moe/kernels.h"

namespace shardwise::train {

void validate_llama(const GptConfig& c) {
  const int64_t kv = c.key_value_heads();
  SW_CHECK(kv >= 1 && kv <= c.heads && c.heads % kv == 0,
           "llama: {} key/value heads must divide the {} attention heads (grouped-query attention)", kv, c.heads);
  SW_CHECK(c.head_dim >= 0, "llama: head_dim must be positive (0: hidden / heads), got {}", c.head_dim);
  SW_CHECK(c.head_size() % 2 == 0,
           "llama: the head dim {} (head_dim, or hidden {} / {} heads) must be even: rotary embeddings rotate its two "
           "halves", c.head_size(), c.hidden, c.heads);
  SW_CHECK(c.intermediate_size >= 0, "llama: intermediate size must be positive (0: 4 x hidden), got {}",
           c.intermediate_size);
  SW_CHECK(c.rope_theta > 0 && std::isfinite(c.rope_theta), "llama: rope theta must be positive, got {}", c.rope_theta);
  SW_CHECK(c.rms_norm_eps > 0, "llama: the RMSNorm epsilon must be positive, got {}", c.rms_norm_eps);
  SW_CHECK(c.family == "llama" || c.family == "qwen2" || c.family == "qwen3" || c.family == "mistral",
           "llama: the family '{}' is not one shardwise builds (llama, qwen2, qwen3, mistral)", c.family);
  SW_CHECK(c.family == "llama" || c.experts == 0, "llama: --experts {} with the {} family: mixture-of-experts layers "
           "are built for Llama (Mixtral) only", c.experts, c.family);
  SW_CHECK(c.experts >= 0, "llama: --experts must be >= 0 (0: dense MLPs), got {}", c.experts);
  SW_CHECK(c.shared_expert_width >= 0 && (c.shared_expert_width == 0 || c.experts > 0),
           "llama: --shared-expert-width {} needs --experts and must be >= 0", c.shared_expert_width);
  if (c.experts == 0) return;
  SW_CHECK(c.top_k >= 1 && c.top_k <= c.experts, "llama: --top-k {} must be in [1, --experts {}]", c.top_k, c.experts);
  for (int64_t l : c.moe_layers) {
    SW_CHECK(l >= 0 && l < c.layers, "llama: --moe-layers names layer {}; the model has layers 0 .. {}", l,
             c.layers - 1);
  }
  SW_CHECK(c.aux_loss >= 0 && c.router_z_loss >= 0 && c.capacity_factor >= 0,
           "llama: --aux-loss ({}), --router-z-loss ({}) and --capacity-factor ({}) must be >= 0", c.aux_loss,
           c.router_z_loss, c.capacity_factor);
  SW_CHECK(c.aux_loss_scope == "layer" || c.aux_loss_scope == "model",
           "llama: --aux-loss-scope '{}' is not a scope (layer, model)", c.aux_loss_scope);
  SW_CHECK(c.aux_loss_scope == "layer" || c.aux_loss == 0 || c.router == "softmax",
           "llama: --aux-loss-scope model is transformers' loss of softmax routers; --router {} needs --aux-loss-scope "
           "layer", c.router);
}

namespace {

// One micro-batch's graph, written as transformers' LlamaForCausalLM computes it.
class LlamaBuilder {
 public:
  LlamaBuilder(const GptConfig& c, const Strategy& s, int64_t sequences, bool training, GptGraph& out)
      : c_(c), s_(s), g_(out.g), training_(training), B_(sequences), S_(c.seq), H_(c.hidden), NH_(c.heads),
        KV_(c.key_value_heads()), HD_(c.head_size()) {
    kv_sharded_ = KV_ % s.tp_size() == 0;
    if (c.lora.enabled()) {
      for (LoraModule& m : lora_modules(c)) lora_[m.path] = std::move(m);
    }
  }

  std::string placements(const char* on_tp, const char* on_dp = "R") const { return s_.placements(on_tp, on_dp); }
  void annotate(graph::ValueId v, const std::string& p) {
    if (s_.mesh.ndim() > 0) g_.annotate(v, p);
  }
  // Between pipeline stages: batch on dp; sequence on tp with sp, else replicated on tp.
  std::string boundary() const { return placements(s_.sequence_parallel ? "S(1)" : "R", "S(0)"); }

  // A parameter as stored (f32, or bf16 cast to f32 for the kernels, as GPT-2's). With LoRA every
  // base parameter is a frozen leaf and the adapters (`adapter`) are the graph's parameters.
  graph::ValueId leaf(const std::string& name, const Shape& shape, bool adapter = false) {
    if (c_.lora.enabled() && !adapter) return g_.frozen(name, shape, c_.param_dtype);
    return g_.param(name, shape, c_.param_dtype);
  }
  graph::ValueId param(const std::string& name, const Shape& shape, const char* on_tp, bool adapter = false) {
    auto v = leaf(name, shape, adapter);
    if (s_.tp >= 0) annotate(v, placements(on_tp));
    if (c_.param_dtype == DType::F32) return v;
    return g_.op1("cast", {v}, {{"dtype", std::string("f32")}}, name + ".f32");
  }

  graph::ValueId rms_norm(graph::ValueId x, const std::string& name) {
    auto w = param(name + ".weight", Shape{H_}, "R");
    auto y = g_.op1("rms_norm", {x, w}, {{"begin_norm_axis", int64_t{-1}}, {"epsilon", c_.rms_norm_eps}}, name + ".out");
    // Gathered before the column-parallel matmuls; where on_gathered casts it to bf16 first, on its
    // sequence shard (the shard the norm computed).
    if (s_.sequence_parallel) annotate(y, sp_norm_placements(g_, c_, s_, training_));
    return y;
  }

  // x [.., in] times weight [out, in] transposed (nn.Linear, no bias), plus the LoRA adapter's
  // product when the module is adapted. Column-parallel: the weight S(0) on tp (or `replicated`);
  // row-parallel: S(1), the output reduce-scattered onto the sequence with sp.
  graph::ValueId linear(graph::ValueId x, const std::string& name, int64_t in, int64_t out, bool column,
                        bool replicated = false) {
    auto w = param(name + ".weight", Shape{out, in}, replicated ? "R" : column ? "S(0)" : "S(1)");
    auto y = compute_matmul(g_, c_, x, w, true, name + ".out");
    if (!column && s_.sequence_parallel) annotate(y, placements("S(1)", "S(0)"));
    if (!lora_.contains(name)) return y;
    return g_.add(y, adapter(x, name, in, out, column, replicated), name + ".out+lora");
  }

  // LoRA's s · dropout(x) A^T B^T, A [r, in] and B [out, r] placed as the base weight: for a
  // column-parallel base A replicated and B S(0) on its output dim (B replicated with a replicated
  // base); for a row-parallel one A S(1) on its input dim (x A^T is Partial(sum) over tp, reduced
  // here at r / in of the base product's size) and B replicated, so the sum with x W^T needs no
  // further collective.
  graph::ValueId adapter(graph::ValueId x, const std::string& name, int64_t in, int64_t out, bool column,
                         bool replicated) {
    const int64_t r = c_.lora.rank;
    auto a = param(lora_a_name(name), Shape{r, in}, column ? "R" : "S(1)", true);
    auto dropped = dropout_at(g_, c_, training_, x, name + ".lora_dropout", c_.lora.dropout);
    auto u = g_.scale(compute_matmul(g_, c_, dropped, a, true, name + ".lora_A.out"), c_.lora.scale(), 0.0,
                      name + ".lora.scaled");
    if (!column) annotate(u, placements("R", "S(0)"));
    auto b = param(lora_b_name(name), Shape{out, r}, column && !replicated ? "S(0)" : "R", true);
    return compute_matmul(g_, c_, u, b, true, name + ".lora_B.out");
  }

  // A column-parallel q/k/v projection of the hidden states, plus its bias [out] (Qwen2), sharded
  // with the weight's rows (or replicated with them).
  graph::ValueId projection(graph::ValueId h, const std::string& name, int64_t out, bool replicated) {
    auto y = linear(h, name, H_, out, true, replicated);
    if (!c_.qkv_bias()) return y;
    return g_.add(y, param(name + ".bias", Shape{out}, replicated ? "R" : "S(0)"), name + ".biased");
  }

  graph::ValueId embeddings() {
    auto ids = g_.input("ids", Shape{B_, S_}, DType::I64);
    annotate(ids, placements("R", "S(0)"));
    embed_ = param("model.embed_tokens.weight", Shape{c_.vocab, H_}, "S(0)");
    auto x = g_.embedding(ids, embed_, "tok_emb");
    if (s_.sequence_parallel) annotate(x, placements("S(1)", "S(0)"));  // reduce-scattered onto the sequence
    return x;
  }

  // The causal mask [S, S] and the positions 0 .. S-1 [S] shared by every sequence, or with packed
  // documents each sequence's own (packing.h): "attention_mask" [B, 1, S, S] (broadcast over the
  // heads) and "position_ids" [B, S], both sharded with the batch on dp.
  void constants() {
    if (c_.fused_attention() && c_.document_mask) {  // fused attention: document ids [B, S], no mask
      mask_ = g_.input("document_ids", Shape{B_, S_}, DType::I64);
      positions_ = g_.input("position_ids", Shape{B_, S_}, DType::I64);
      annotate(mask_, placements("R", "S(0)"));
      annotate(positions_, placements("R", "S(0)"));
      return;
    }
    if (c_.document_mask) {
      mask_ = g_.input("attention_mask", Shape{B_, 1, S_, S_});
      positions_ = g_.input("position_ids", Shape{B_, S_}, DType::I64);
      annotate(mask_, s_.placements("R", "S(0)", "R"));  // dim 1 is the heads' broadcast: whole on cp
      annotate(positions_, placements("R", "S(0)"));
      return;
    }
    if (!c_.fused_attention()) {
      mask_ = g_.input("causal_mask", Shape{S_, S_});
      annotate(mask_, placements("R"));
    }
    positions_ = g_.input("positions", Shape{S_}, DType::I64);
    annotate(positions_, placements("R"));
  }

  // [B, S, n * HD] -> [B, n, S, HD], rotated by the positions when `rotate` (Qwen3: each head
  // RMS-normalised first by "<attn>.q_norm" / ".k_norm", a weight [HD] replicated).
  graph::ValueId heads(graph::ValueId t, int64_t n, const std::string& name, bool rotate) {
    auto h = g_.transpose(g_.reshape(t, {B_, S_, n, HD_}, name + ".split"), {0, 2, 1, 3}, name + ".heads");
    if (!rotate) return h;
    if (qk_norm(c_)) {
      auto w = param(name + "_norm.weight", Shape{HD_}, "R");
      h = g_.op1("rms_norm", {h, w}, {{"begin_norm_axis", int64_t{-1}}, {"epsilon", c_.rms_norm_eps}}, name + ".norm");
    }
    return g_.op1("rotary_embedding", {h, positions_}, {{"theta", c_.rope_theta}}, name + ".rotary");
  }

  // transformers' repeat_kv: [B, KV, S, HD] -> [B, KV, n_rep, S, HD] -> [B, NH, S, HD].
  graph::ValueId repeat_kv(graph::ValueId t, const std::string& name) {
    if (KV_ == NH_) return t;
    auto one = g_.reshape(t, {B_, KV_, 1, S_, HD_}, name + ".unsqueeze");
    auto rep = g_.op1("expand", {one}, {{"shape", std::vector<int64_t>{B_, KV_, NH_ / KV_, S_, HD_}}}, name + ".expand");
    return g_.reshape(rep, {B_, NH_, S_, HD_}, name + ".repeat");
  }


  graph::ValueId attention(graph::ValueId h, const std::string& p, bool selective) {
    const int64_t kv_width = KV_ * HD_;
    auto qkv = on_gathered(g_, c_, s_, training_, h, true, [&](graph::ValueId x) {
      return std::vector<graph::ValueId>{projection(x, p + ".q_proj", NH_ * HD_, false),
                                         projection(x, p + ".k_proj", kv_width, !kv_sharded_),
                                         projection(x, p + ".v_proj", kv_width, !kv_sharded_)};
    });
    auto q = heads(qkv[0], NH_, p + ".q", true);
    auto k = heads(qkv[1], KV_, p + ".k", true);
    auto v = heads(qkv[2], KV_, p + ".v", false);
    if (c_.fused_attention()) return linear(fused(q, k, v, p), p + ".o_proj", NH_ * HD_, H_, false);
    k = repeat_kv(k, p + ".k");
    v = repeat_kv(v, p + ".v");
    auto ctx_heads = unfused_attention(g_, c_, training_, q, k, v, mask_, p, selective);
    auto ctx = g_.reshape(g_.transpose(ctx_heads, {0, 2, 1, 3}, p + ".ctx.t"), {B_, S_, NH_ * HD_}, p + ".ctx");
    return linear(ctx, p + ".o_proj", NH_ * HD_, H_, false);
  }

  // LoRA on stacked expert weights w [E, out, in] as PEFT's lora.ParamWrapper adapts transformers'
  // fused parameter `fused` (lora.h): w + s B_e A_e for each expert e, with A [E r, in] split over ep
  // as the experts (its rows are expert-major) and B [out, E r] replicated (its columns are rank-major,
  // expert-minor); `ws` are the parts of the fused parameter (w1 and w3: gate_up_proj's rows), which
  // share A and each have their rows of B. The MoE op reads the sums, whose gradient reaches A and B
  // through the batched products; the w's stay frozen.
  std::vector<graph::ValueId> expert_adapted(std::vector<graph::ValueId> ws, const std::string& fused,
                                             const std::vector<std::string>& on_ep) {
    auto it = std::find_if(lora_.begin(), lora_.end(), [&](const auto& kv) { return kv.second.parameter == fused; });
    if (it == lora_.end()) return ws;
    const LoraModule& m = it->second;
    const int64_t E = c_.experts, r = c_.lora.rank, out = m.out / static_cast<int64_t>(m.parts.size());
    auto leaf_on = [&](const std::string& name, const Shape& shape, const std::string& placement) {
      auto v = leaf(name, shape, true);
      annotate(v, placement);
      if (c_.param_dtype == DType::F32) return v;
      return g_.op1("cast", {v}, {{"dtype", std::string("f32")}}, name + ".f32");
    };
    auto a = leaf_on(lora_a_name(m.path), Shape{E * r, m.in}, fmt::format("{}", fmt::join(on_ep, ",")));
    auto a3 = g_.reshape(a, {E, r, m.in}, m.path + ".lora_A.experts");
    for (size_t i = 0; i < ws.size(); ++i) {
      const std::string& name = m.parts[i];
      auto b = leaf_on(lora_b_name(name), Shape{out, E * r},
                       fmt::format("{}", fmt::join(std::vector<std::string>(on_ep.size(), "R"), ",")));
      auto b3 = g_.transpose(g_.reshape(b, {out, r, E}, name + ".lora_B.split"), {2, 0, 1}, name + ".lora_B.experts");
      auto delta = g_.scale(g_.matmul(b3, a3, false, name + ".lora.delta"), c_.lora.scale(), 0.0, name + ".lora.scaled");
      ws[i] = g_.add(ws[i], delta, name + ".with_lora");
    }
    return ws;
  }

  // Mixtral's block_sparse_moe on the tokens [B * S, H]: the router gate.weight [E, H] replicated,
  // the experts' w1, w3 [E, I, H] and w2 [E, H, I] stacked and split over ep on E.
  graph::ValueId moe(graph::ValueId h, const std::string& p) {
    const int64_t I = c_.mlp_width(), E = c_.experts;
    std::vector<std::string> on_ep(static_cast<size_t>(s_.mesh.ndim()), "R");
    if (s_.ep >= 0) on_ep[static_cast<size_t>(s_.ep)] = "S(0)";
    auto expert = [&](const std::string& name, const Shape& shape) {
      auto v = leaf(name, shape);
      annotate(v, fmt::format("{}", fmt::join(on_ep, ",")));
      if (c_.param_dtype == DType::F32) return v;
      return g_.op1("cast", {v}, {{"dtype", std::string("f32")}}, name + ".f32");
    };
    auto gate = param(p + ".gate.weight", Shape{E, H_}, "R");
    // LoRA: transformers' experts.gate_up_proj is w1 | w3, its down_proj w2 (lora.h).
    const std::string fused = p.substr(0, p.rfind('.')) + ".mlp.experts";
    const std::vector<graph::ValueId> w13 = expert_adapted(
        {expert(p + ".experts.w1", Shape{E, I, H_}), expert(p + ".experts.w3", Shape{E, I, H_})}, fused + ".gate_up_proj", on_ep);
    auto w1 = w13[0], w3 = w13[1];
    auto w2 = expert_adapted({expert(p + ".experts.w2", Shape{E, H_, I})}, fused + ".down_proj", on_ep)[0];
    auto tokens = moe_tokens(h, p);
    // Under bf16 compute the experts' GEMMs read bf16 tokens and weights (f32 sums; out, the aux
    // and z losses f32: ops/moe/kernels.h). The router reads the same bf16 tokens widened, with the
    // gate in f32, and routes in f64, Megatron's moe_router_dtype fp32: top-k choices are sensitive
    // to rounding.
    auto expert_tokens = compute_operand(g_, c_, tokens);
    Attrs a{{"top_k", c_.top_k}};
    if (c_.capacity_factor > 0) a.set("capacity_factor", c_.capacity_factor);
    if (c_.router != "softmax") a.set("router", c_.router);
    w1 = compute_operand(g_, c_, w1), w3 = compute_operand(g_, c_, w3), w2 = compute_operand(g_, c_, w2);
    std::vector<graph::ValueId> o = g_.op("moe_mlp", {expert_tokens, gate, w1, w3, w2}, a, p + ".moe");
    if (c_.aux_loss > 0 && c_.aux_loss_scope == "model") {
      pool_router_statistics(tokens, gate, o[4], p);
    } else if (c_.aux_loss > 0) {
      router_loss_ = add_loss(router_loss_, g_.scale(o[1], c_.aux_loss, 0.0, p + ".aux_loss"));
    }
    if (c_.router_z_loss > 0) {
      router_loss_ = add_loss(router_loss_, g_.scale(o[2], c_.router_z_loss, 0.0, p + ".z_loss"));
    }
    auto out = moe_sequences(o[0], p);
    if (c_.shared_expert_width == 0) return out;
    auto gate_of = g_.op1("sigmoid", {linear(h, p + ".shared_expert_gate", H_, 1, true, true)}, {}, p + ".shared_gate");
    auto shared = g_.multiply(gate_of, mlp(h, p + ".shared_expert", c_.shared_expert_width), p + ".shared_out");
    return g_.add(out, shared, p + ".with_shared");
  }
  // The MoE layer's tokens [B * S, H] from the residual [B, S, H]. On a cp mesh they go chunk-major
  // ([B, C, S/C, H] -> [C, B, S/C, H] -> [C * B * S/C, H], C = cp): the flatten then keeps both the
  // batch's data sharding and cp's (co-shard order cp, data dims), so every rank routes just the
  // tokens it holds; batch-major, cp would be gathered and every cp rank would route the whole
  // sequence. `moe_sequences` undoes it.
  graph::ValueId moe_tokens(graph::ValueId h, const std::string& p) {
    const int64_t C = s_.cp_size();
    if (C == 1) return g_.reshape(h, {B_ * S_, H_}, p + ".tokens");
    auto chunks = g_.reshape(h, {B_, C, S_ / C, H_}, p + ".tokens.chunks");
    auto major = g_.transpose(chunks, {1, 0, 2, 3}, p + ".tokens.chunk_major");
    return g_.reshape(major, {B_ * S_, H_}, p + ".tokens");
  }
  graph::ValueId moe_sequences(graph::ValueId out, const std::string& p) {
    const int64_t C = s_.cp_size();
    if (C == 1) return g_.reshape(out, {B_, S_, H_}, p + ".out");
    auto major = g_.reshape(out, {C, B_, S_ / C, H_}, p + ".out.chunk_major");
    auto chunks = g_.transpose(major, {1, 0, 2, 3}, p + ".out.chunks");
    return g_.reshape(chunks, {B_, S_, H_}, p + ".out");
  }
  // --aux-loss-scope model: sums over this layer's tokens of each expert's assignments (moe_mlp's
  // expert_tokens, no gradient) and router probabilities (the router's softmax again: [N, E], a
  // GEMM of E columns) join the pool that pooled_aux_loss turns into one term.
  void pool_router_statistics(graph::ValueId tokens, graph::ValueId gate, graph::ValueId expert_tokens,
                              const std::string& p) {
    auto probs = g_.softmax(g_.matmul(tokens, gate, true, p + ".router_logits"), -1, p + ".router_probs");
    auto prob_sums = g_.sum(probs, {0}, false, p + ".router_prob_sums");
    auto counts = g_.op1("cast", {expert_tokens}, {{"dtype", std::string("f32")}}, p + ".expert_counts");
    pooled_probs_ = pooled_probs_ < 0 ? prob_sums : g_.add(pooled_probs_, prob_sums, p + ".pooled_probs");
    pooled_counts_ = pooled_counts_ < 0 ? counts : g_.add(pooled_counts_, counts, p + ".pooled_counts");
    ++pooled_layers_;
  }
  // transformers' load_balancing_loss_func of the pooled layers: E · Σ_e (C_e / LN) (P_e / LN), the
  // counts C and probability sums P over L layers of N tokens each; scaled by aux_loss.
  void add_pooled_aux_loss() {
    if (pooled_layers_ == 0) return;
    const double rows = static_cast<double>(pooled_layers_ * B_ * S_);
    auto dot = g_.sum(g_.multiply(pooled_counts_, pooled_probs_, "pooled.products"), {}, false, "pooled.aux_loss.raw");
    const double scale = c_.aux_loss * static_cast<double>(c_.experts) / (rows * rows);
    router_loss_ = add_loss(router_loss_, g_.scale(dot, scale, 0.0, "pooled.aux_loss"));
  }
  graph::ValueId add_loss(graph::ValueId sum, graph::ValueId term) {
    return sum < 0 ? term : g_.add(sum, term, g_.value(term).name + ".sum");
  }
  graph::ValueId router_loss() const { return router_loss_; }
  // flash_attention on q [B, NH, S, HD] and k, v [B, KV, S, HD] -> ctx [B, S, H]. Grouped-query
  // heads are the op's grouped layout q [B, KV, NH / KV, S, HD] when the kv heads are whole on
  // each tp rank (tp divides KV: the reshape keeps the head shard as a group shard); otherwise
  // k and v are repeated to NH heads first, as the unfused graph does (computed on every tp rank).
  graph::ValueId fused(graph::ValueId q, graph::ValueId k, graph::ValueId v, const std::string& p) {
    const bool grouped = KV_ != NH_ && kv_sharded_;
    if (grouped) {
      q = g_.reshape(q, {B_, KV_, NH_ / KV_, S_, HD_}, p + ".q.groups");
    } else {
      k = repeat_kv(k, p + ".k");
      v = repeat_kv(v, p + ".v");
    }
    auto o = fused_attention(g_, c_, training_, q, k, v, c_.document_mask ? mask_ : -1, p + ".ctx.heads",
                             p + ".dropout");
    if (grouped) o = g_.reshape(o, {B_, NH_, S_, HD_}, p + ".ctx.heads.merged");
    return g_.reshape(g_.transpose(o, {0, 2, 1, 3}, p + ".ctx.t"), {B_, S_, NH_ * HD_}, p + ".ctx");
  }

  graph::ValueId mlp(graph::ValueId h, const std::string& p, int64_t width = 0) {
    const int64_t I = width > 0 ? width : c_.mlp_width();
    auto gate_up = on_gathered(g_, c_, s_, training_, h, true, [&](graph::ValueId x) {
      return std::vector<graph::ValueId>{linear(x, p + ".gate_proj", H_, I, true), linear(x, p + ".up_proj", H_, I, true)};
    });
    return linear(g_.op1("swiglu", {gate_up[0], gate_up[1]}, {}, p + ".act"), p + ".down_proj", I, H_, false);
  }

  // Layer l, the stage's layer number `index` (which ones recompute).
  graph::ValueId layer(graph::ValueId x, int64_t l, int64_t index) {
    const std::string p = fmt::format("model.layers.{}", l);
    const bool full = training_ && c_.recompute_full(index);
    if (full) g_.begin_segment();
    auto a = attention(rms_norm(x, p + ".input_layernorm"), p + ".self_attn", training_ && c_.recompute_selective(index));
    x = g_.add(x, a, p + ".attn.residual");
    auto normed = rms_norm(x, p + ".post_attention_layernorm");
    auto m = c_.is_moe_layer(l) ? moe(normed, p + ".block_sparse_moe") : mlp(normed, p + ".mlp");
    auto out = g_.add(x, m, p + ".mlp.residual");
    if (full) g_.end_segment();
    return out;
  }

  // The final norm, the head (tied: the embedding, the last stage's copy when it has none) and
  // the loss (training) or the greedy predictions.
  void head(graph::ValueId x, GptGraph& out) {
    graph::ValueId w = c_.tie_word_embeddings ? embed_ : param("lm_head.weight", Shape{c_.vocab, H_}, "S(0)");
    if (w < 0) w = param("model.embed_tokens.weight", Shape{c_.vocab, H_}, "S(0)");
    // As GPT-2's (gpt.h); the MoE layers' weighted router losses join the cross-entropy mean.
    if (training_) add_pooled_aux_loss();
    head_loss(g_, c_, s_, rms_norm(x, "model.norm"), w, training_, out, router_loss_ < 0 ? "loss" : "loss.ce");
    if (training_ && router_loss_ >= 0) out.loss = g_.add(out.loss, router_loss_, "loss");
  }

 private:
  const GptConfig& c_;
  const Strategy& s_;
  graph::Graph& g_;
  bool training_;
  int64_t B_, S_, H_, NH_, KV_, HD_;
  bool kv_sharded_ = true;
  graph::ValueId embed_ = -1, mask_ = -1, positions_ = -1;
  graph::ValueId router_loss_ = -1;  // the weighted aux and z losses of the MoE layers so far
  graph::ValueId pooled_counts_ = -1, pooled_probs_ = -1;  // --aux-loss-scope model: [E] sums so far
  int64_t pooled_layers_ = 0;
  std::map<std::string, LoraModule> lora_;  // the adapted modules, by path
};

}  // namespace

GptGraph build_llama(const GptConfig& c, const Strategy& s, int64_t sequences, bool training, const GptPart& part) {
  c.validate();
  SW_CHECK(c.is_llama(), "build_llama: the configuration is a '{}' model", c.model_type);
  SW_CHECK(c.sliding_window == 0 || c.sliding_window >= c.seq,
           "mistral: sliding_window {} is shorter than the sequence length {}: shardwise's attention is full causal "
           "attention over the sequence, not a sliding window; train on sequences of at most {} tokens (--seq {})",
           c.sliding_window, c.seq, c.sliding_window, c.sliding_window);
  SW_CHECK(sequences >= 1, "a micro-batch must hold at least 1 sequence, got {}", sequences);
  SW_CHECK(c.heads % s.tp_size() == 0, "{} heads do not divide over tp={} (each tp rank needs whole heads)", c.heads,
           s.tp_size());
  SW_CHECK(sequences % s.data_size() == 0, "a micro-batch of {} sequences does not divide over dp={}{}", sequences,
           s.dp_size(), s.ep < 0 ? "" : fmt::format(" x ep={}", s.ep_size()));
  SW_CHECK(c.experts == 0 || c.experts % s.ep_size() == 0, "{} experts do not divide over ep={}", c.experts,
           s.ep_size());
  SW_CHECK(s.ep < 0 || c.experts > 0, "the mesh {} has an ep dim but the model has no experts (--experts)",
           s.mesh.to_string());
  if (c.experts > 0) ops::check_moe_exchange_setting();
  const int64_t end_layer = part.end_layer < 0 ? c.layers : part.end_layer;
  SW_CHECK(c.aux_loss_scope == "layer" || c.aux_loss == 0 || (part.first_layer == 0 && end_layer == c.layers),
           "--aux-loss-scope model pools the router statistics of every MoE layer into one term (transformers' "
           "Mixtral), so every layer must be on one pipeline stage: use --aux-loss-scope layer with pp");
  SW_CHECK(0 <= part.first_layer && part.first_layer <= end_layer && end_layer <= c.layers,
           "layers [{}, {}) are not a range of the model's {} layers", part.first_layer, end_layer, c.layers);
  GptGraph out;
  out.sequences = sequences;
  LlamaBuilder b(c, s, sequences, training, out);
  graph::ValueId x;
  if (part.embeddings) {
    x = b.embeddings();
  } else {
    out.input = x = out.g.input("stage_input", Shape{sequences, c.seq, c.hidden});
    out.g.value(x).requires_grad = training;
    b.annotate(x, b.boundary());
  }
  b.constants();
  for (int64_t l = part.first_layer; l < end_layer; ++l) x = b.layer(x, l, l - part.first_layer);
  if (!part.head) {
    b.annotate(x, b.boundary());
    out.output = x;
    out.output_grad = out.g.input(out.g.value(x).name + "@grad_in", Shape{sequences, c.seq, c.hidden});
    b.annotate(out.output_grad, b.boundary());
    if (training) out.extra_loss = b.router_loss();  // the stage's router losses (pipeline: seeded with 1)
    return out;
  }
  b.head(x, out);
  return out;
}

Tensor init_llama_param_block(const GptConfig& c, const std::string& name, const Shape& shape,
                              std::span<const int64_t> offset, const Shape& block, uint64_t seed) {
  if (name.ends_with("norm.weight")) return Tensor::full(DType::F32, block, 1.0);
  // GPT-2's draw: normal(0, init_std) keyed by (seed, name) at the global index; no Llama name is
  // one GPT-2 initializes otherwise (LayerNorms, biases, c_proj).
  return init_param_block(c, name, shape, offset, block, seed);
}

std::array<std::string, 4> moe_op_stat_names(const std::string& op) {
  std::array<std::string, 4> out;
  for (size_t i = 0; i < out.size(); ++i) out[i] = fmt::format("{}:{}", op, i + 1);
  return out;
}

std::array<std::string, 4> moe_stat_names(int64_t layer) {
  return moe_op_stat_names(fmt::format("model.layers.{}.block_sparse_moe.moe", layer));
}

Tensor position_ids(int64_t seq, int64_t cp_order) {
  Tensor t(DType::I64, Shape{seq});
  for (int64_t i = 0; i < seq; ++i) t.data<int64_t>()[i] = mesh::cp_balanced_position(i, seq, cp_order);
  return t;
}

}  // namespace shardwise::train
