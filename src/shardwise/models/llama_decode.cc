#include "shardwise/models/llama_decode.h"

#include <cmath>
#include <functional>

#include "shardwise/core/error.h"
#include "shardwise/models/llama.h"

namespace shardwise::train {
namespace {

// Rotates heads [B, n, T, head_dim] by their positions (each graph passes them its own way).
using Rotate = std::function<graph::ValueId(graph::ValueId, const std::string&)>;
// Attention of one layer: (q rotated and scaled [B, heads, T, hd], k rotated and v [B, kv_heads,
// T, hd] of the new tokens, layer) -> the context [B, heads, T, hd].
using Attend = std::function<graph::ValueId(graph::ValueId, graph::ValueId, graph::ValueId, int64_t)>;

// build_llama's parameters, annotations and arithmetic (f32, no dropout) over B sequences of T
// new tokens; the attention itself is the graph's (`Attend`).
class LlamaDecoder {
 public:
  LlamaDecoder(const GptConfig& c, const Strategy& s, graph::Graph& g, int64_t batch, int64_t tokens,
               const DecodePart& part)
      : c_(c), s_(s), g_(g), B_(batch), T_(tokens), H_(c.hidden), NH_(c.heads), KV_(c.key_value_heads()),
        HD_(c.head_size()), kv_sharded_(c.key_value_heads() % s.tp_size() == 0), part_(part) {}

  void annotate(graph::ValueId v, const std::string& p) {
    if (s_.mesh.ndim() > 0) g_.annotate(v, p);
  }

  // The first stage's entry: "ids" [B, T] (the batch on the data dims), embedded.
  graph::ValueId embed_inputs(const std::string& batch) {
    auto ids = g_.input("ids", Shape{B_, T_}, DType::I64);
    annotate(ids, batch);
    return embed(ids);
  }

  graph::ValueId embed(graph::ValueId ids) {
    embed_ = param("model.embed_tokens.weight", Shape{c_.vocab, H_}, "S(0)");
    return g_.embedding(ids, embed_, "tok_emb");
  }

  graph::ValueId blocks(graph::ValueId x, const Rotate& rotate, const Attend& attend) {
    for (int64_t l = part_.first_layer; l < part_.end(c_); ++l) {
      const std::string p = fmt::format("model.layers.{}", l), a = p + ".self_attn";
      auto h = rms_norm(x, p + ".input_layernorm");
      auto q = rotate(normed(heads(projection(h, a + ".q_proj", NH_ * HD_, false), NH_, a + ".q"), a + ".q"), a + ".q");
      auto k = rotate(normed(heads(projection(h, a + ".k_proj", KV_ * HD_, !kv_sharded_), KV_, a + ".k"), a + ".k"),
                      a + ".k");
      auto v = heads(projection(h, a + ".v_proj", KV_ * HD_, !kv_sharded_), KV_, a + ".v");
      auto q_scaled = g_.scale(q, 1.0 / std::sqrt(static_cast<double>(HD_)), 0.0, a + ".q.scaled");
      auto ctx_heads = attend(q_scaled, k, v, l);
      auto ctx = g_.reshape(g_.transpose(ctx_heads, {0, 2, 1, 3}, a + ".ctx.t"), {B_, T_, NH_ * HD_}, a + ".ctx");
      x = g_.add(x, linear(ctx, a + ".o_proj", NH_ * HD_, H_, false), p + ".attn.residual");
      auto m = rms_norm(x, p + ".post_attention_layernorm");
      x = g_.add(x, c_.is_moe_layer(l) ? moe(m, p + ".block_sparse_moe") : mlp(m, p + ".mlp"), p + ".mlp.residual");
    }
    return x;
  }

  graph::ValueId mlp(graph::ValueId m, const std::string& p) {
    auto gate = linear(m, p + ".gate_proj", H_, c_.mlp_width(), true);
    auto up = linear(m, p + ".up_proj", H_, c_.mlp_width(), true);
    auto act = g_.op1("swiglu", {gate, up}, {}, p + ".act");
    return linear(act, p + ".down_proj", c_.mlp_width(), H_, false);
  }

  // build_llama's Mixtral MoE MLP (the moe_mlp op) on the [B * T, H] tokens, dropless (each token's
  // output depends on that token only, as generation needs); the experts split over ep on E as in
  // training (each ep rank holds E / ep of them, tokens exchanged all-to-all), replicated elsewhere.
  graph::ValueId moe(graph::ValueId m, const std::string& p) {
    const int64_t E = c_.experts, I = c_.mlp_width();
    auto expert = [&](const std::string& name, const Shape& shape) {
      auto v = g_.param(name, shape, DType::F32);
      annotate(v, expert_placements(s_));
      return v;
    };
    auto gate = param(p + ".gate.weight", Shape{E, H_}, "R");
    auto w1 = expert(p + ".experts.w1", Shape{E, I, H_});
    auto w3 = expert(p + ".experts.w3", Shape{E, I, H_});
    auto w2 = expert(p + ".experts.w2", Shape{E, H_, I});
    auto tokens = g_.reshape(m, {B_ * T_, H_}, p + ".tokens");
    std::vector<graph::ValueId> o = g_.op("moe_mlp", {tokens, gate, w1, w3, w2}, Attrs{{"top_k", c_.top_k}}, p + ".moe");
    return g_.reshape(o[0], {B_, T_, H_}, p + ".out");
  }

  // transformers' repeat_kv: [B, KV, L, HD] -> [B, heads, L, HD] (head h reads kv head h / (heads / KV)).
  graph::ValueId repeat_kv(graph::ValueId t, int64_t length, const std::string& name) {
    if (KV_ == NH_) return t;
    auto one = g_.reshape(t, {B_, KV_, 1, length, HD_}, name + ".unsqueeze");
    auto rep = g_.op1("expand", {one}, {{"shape", std::vector<int64_t>{B_, KV_, NH_ / KV_, length, HD_}}},
                      name + ".expand");
    return g_.reshape(rep, {B_, NH_, length, HD_}, name + ".repeat");
  }

  // logits [B, T', V] of hidden states [B, T', H]: the final norm and the head (tied: the embedding).
  graph::ValueId head(graph::ValueId x, const std::string& name) {
    if (c_.tie_word_embeddings && embed_ < 0) embed_ = param("model.embed_tokens.weight", Shape{c_.vocab, H_}, "S(0)");
    auto w = c_.tie_word_embeddings ? embed_ : param("lm_head.weight", Shape{c_.vocab, H_}, "S(0)");
    return g_.matmul(rms_norm(x, "model.norm"), w, true, name);
  }

 private:
  graph::ValueId param(const std::string& name, const Shape& shape, const char* on_tp) {
    auto v = g_.param(name, shape, DType::F32);
    if (s_.tp >= 0) annotate(v, s_.placements(on_tp));
    return v;
  }
  graph::ValueId rms_norm(graph::ValueId x, const std::string& name) {
    auto w = param(name + ".weight", Shape{H_}, "R");
    return g_.op1("rms_norm", {x, w}, {{"begin_norm_axis", int64_t{-1}}, {"epsilon", c_.rms_norm_eps}}, name + ".out");
  }
  // x [.., in] times weight [out, in] transposed: column-parallel (S(0) on tp, or R when
  // `replicated`) or row-parallel (S(1)).
  graph::ValueId linear(graph::ValueId x, const std::string& name, int64_t in, int64_t out, bool column,
                        bool replicated = false) {
    auto w = param(name + ".weight", Shape{out, in}, replicated ? "R" : column ? "S(0)" : "S(1)");
    return g_.matmul(x, w, true, name + ".out");
  }
  // A column-parallel q/k/v projection plus its bias (Qwen2), sharded or replicated with the weight.
  graph::ValueId projection(graph::ValueId x, const std::string& name, int64_t out, bool replicated) {
    auto y = linear(x, name, H_, out, true, replicated);
    if (!c_.qkv_bias()) return y;
    return g_.add(y, param(name + ".bias", Shape{out}, replicated ? "R" : "S(0)"), name + ".biased");
  }
  // Qwen3: heads [B, n, T, HD] RMS-normalised by "<attn>.q_norm" / ".k_norm" (weight [HD]).
  graph::ValueId normed(graph::ValueId h, const std::string& name) {
    if (!qk_norm(c_)) return h;
    auto w = param(name + "_norm.weight", Shape{HD_}, "R");
    return g_.op1("rms_norm", {h, w}, {{"begin_norm_axis", int64_t{-1}}, {"epsilon", c_.rms_norm_eps}}, name + ".norm");
  }
  // [B, T, n * HD] -> [B, n, T, HD].
  graph::ValueId heads(graph::ValueId t, int64_t n, const std::string& name) {
    return g_.transpose(g_.reshape(t, {B_, T_, n, HD_}, name + ".split"), {0, 2, 1, 3}, name + ".heads");
  }

  const GptConfig& c_;
  const Strategy& s_;
  graph::Graph& g_;
  int64_t B_, T_, H_, NH_, KV_, HD_;
  bool kv_sharded_;
  DecodePart part_;
  graph::ValueId embed_ = -1;
};

void check_llama_decoder(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t length, const char* what) {
  SW_CHECK(c.is_llama(), "the Llama decoder was given a '{}' model", c.model_type);
  check_decoder_shape(c, s, sequences, length, what);
  SW_CHECK(c.experts % s.ep_size() == 0, "{} experts do not divide over ep={} (each ep rank holds whole experts)",
           c.experts, s.ep_size());
  SW_CHECK(s.ep < 0 || c.experts > 0, "the mesh {} has an ep dim but the model has no experts", s.mesh.to_string());
}

// The k / v of the new tokens in the cache's layout; the prefill's are the cache's first T slots.
void annotate_kv(LlamaDecoder& d, const GptConfig& c, const Strategy& s, std::initializer_list<graph::ValueId> kv) {
  for (auto t : kv) d.annotate(t, llama_kv_placements(c, s));
}

}  // namespace

std::string expert_placements(const Strategy& s) {
  std::vector<std::string> on(static_cast<size_t>(s.mesh.ndim()), "R");
  if (s.ep >= 0) on[static_cast<size_t>(s.ep)] = "S(0)";
  return fmt::format("{}", fmt::join(on, ","));
}

std::string llama_kv_placements(const GptConfig& c, const Strategy& s) {
  return s.placements(c.key_value_heads() % s.tp_size() == 0 ? "S(1)" : "R", "S(0)");
}

DecoderGraph build_llama_prefill(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t length,
                                 const DecodePart& part) {
  check_llama_decoder(c, s, sequences, length, "a prefill");
  const int64_t B = sequences, T = length;
  DecoderGraph out;
  out.sequences = B, out.length = T;
  graph::Graph& g = out.g;
  LlamaDecoder d(c, s, g, B, T, part);
  const std::string batch = s.placements("R", "S(0)");
  auto positions = g.input("positions", Shape{T}, DType::I64);  // every sequence starts at 0
  auto mask = g.input("causal_mask", Shape{T, T});
  out.constants["causal_mask"] = causal_mask(T);
  out.constants["positions"] = position_ids(T);
  d.annotate(mask, s.placements("R")), d.annotate(positions, s.placements("R"));
  auto rotate = [&](graph::ValueId h, const std::string& name) {
    return g.op1("rotary_embedding", {h, positions}, {{"theta", c.rope_theta}}, name + ".rotary");
  };
  auto attend = [&](graph::ValueId q, graph::ValueId k, graph::ValueId v, int64_t l) {
    const std::string p = fmt::format("model.layers.{}.self_attn", l);
    out.present_k.push_back(g.value(k).name);
    out.present_v.push_back(g.value(v).name);
    annotate_kv(d, c, s, {k, v});
    auto scores = g.matmul(q, d.repeat_kv(k, T, p + ".k"), true, p + ".scores");
    auto probs = g.softmax(g.add(scores, mask, p + ".masked"), -1, p + ".probs");
    return g.matmul(probs, d.repeat_kv(v, T, p + ".v"), false, p + ".ctx.heads");
  };
  auto x = d.blocks(stage_entry(g, s, part, Shape{B, T, c.hidden}, [&] { return d.embed_inputs(batch); }), rotate,
                    attend);
  if (stage_exit(out, s, part, x)) return out;
  auto last = g.input("last", Shape{B, 1, T});
  d.annotate(last, batch);
  d.head(g.matmul(last, x, false, "last_hidden"), out.logits);
  return out;
}

DecoderGraph build_llama_decode_step(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t cache_length,
                                     const DecodePart& part) {
  check_llama_decoder(c, s, sequences, cache_length, "a KV cache");
  const int64_t B = sequences, C = cache_length, KV = c.key_value_heads(), HD = c.head_size();
  DecoderGraph out;
  out.sequences = B, out.length = C;
  graph::Graph& g = out.g;
  LlamaDecoder d(c, s, g, B, 1, part);
  const std::string batch = s.placements("R", "S(0)");
  auto positions = g.input("positions", Shape{B, 1}, DType::I64);
  auto mask = g.input("cache_mask", Shape{B, 1, 1, C + 1});
  d.annotate(positions, batch), d.annotate(mask, batch);
  auto per_sequence = g.reshape(positions, {B}, "positions.rows");
  // [B, n, 1, HD] -> [n, 1, B, HD]: one row per sequence, rotated by its own position.
  auto rotate = [&](graph::ValueId h, const std::string& name) {
    auto rows = g.transpose(h, {1, 2, 0, 3}, name + ".by_sequence");
    auto r = g.op1("rotary_embedding", {rows, per_sequence}, {{"theta", c.rope_theta}}, name + ".rotary.rows");
    return g.transpose(r, {2, 0, 1, 3}, name + ".rotary");
  };
  auto attend = [&](graph::ValueId q, graph::ValueId k, graph::ValueId v, int64_t l) {
    const std::string p = fmt::format("model.layers.{}.self_attn", l);
    out.past_k.push_back(fmt::format("past.{}.k", l));
    out.past_v.push_back(fmt::format("past.{}.v", l));
    out.present_k.push_back(g.value(k).name);
    out.present_v.push_back(g.value(v).name);
    auto past_k = g.input(out.past_k.back(), Shape{B, KV, C, HD});
    auto past_v = g.input(out.past_v.back(), Shape{B, KV, C, HD});
    annotate_kv(d, c, s, {past_k, past_v, k, v});
    auto keys = g.op1("concat", {past_k, k}, {{"axis", int64_t{2}}}, p + ".keys");
    auto values = g.op1("concat", {past_v, v}, {{"axis", int64_t{2}}}, p + ".values");
    auto scores = g.matmul(q, d.repeat_kv(keys, C + 1, p + ".k"), true, p + ".scores");
    auto probs = g.softmax(g.add(scores, mask, p + ".masked"), -1, p + ".probs");
    return g.matmul(probs, d.repeat_kv(values, C + 1, p + ".v"), false, p + ".ctx.heads");
  };
  auto x = d.blocks(stage_entry(g, s, part, Shape{B, 1, c.hidden}, [&] { return d.embed_inputs(batch); }), rotate,
                    attend);
  if (stage_exit(out, s, part, x)) return out;
  d.head(x, out.logits);
  return out;
}

}  // namespace shardwise::train
