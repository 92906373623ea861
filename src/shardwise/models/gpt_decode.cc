#include "shardwise/models/gpt_decode.h"

#include <cmath>
#include <functional>

#include "shardwise/core/error.h"

namespace shardwise::train {
namespace {

// Attention of one layer: (q scaled, k, v as [B, heads, T, head_dim], layer) -> the context
// [B, heads, T_q, head_dim]. Each graph supplies its own (causal over the prompt, or over the cache).
using Attend = std::function<graph::ValueId(graph::ValueId, graph::ValueId, graph::ValueId, int64_t)>;

// The decoder's shared part: embeddings of (ids, positions) [B, T], the blocks, the final norm
// and the tied head, with build_gpt's parameter names, annotations and arithmetic (f32, no dropout).
class Decoder {
 public:
  Decoder(const GptConfig& c, const Strategy& s, graph::Graph& g, int64_t batch, int64_t tokens, const DecodePart& part)
      : c_(c), s_(s), g_(g), B_(batch), T_(tokens), part_(part) {}

  void annotate(graph::ValueId v, const std::string& p) {
    if (s_.mesh.ndim() > 0) g_.annotate(v, p);
  }

  // x [B, T, H] = wte[ids] + wpe[positions].
  graph::ValueId embed(graph::ValueId ids, graph::ValueId positions) {
    wte_ = param("transformer.wte.weight", Shape{c_.vocab, c_.hidden}, "S(0)");
    auto wpe = param("transformer.wpe.weight", Shape{c_.seq, c_.hidden});
    return g_.add(g_.embedding(ids, wte_, "tok_emb"), g_.embedding(positions, wpe, "pos_emb"), "emb");
  }

  // The first stage's entry: "ids" and "positions" [B, T] (the batch on the data dims), embedded.
  graph::ValueId embed_inputs(const std::string& batch) {
    auto ids = g_.input("ids", Shape{B_, T_}, DType::I64);
    auto positions = g_.input("positions", Shape{B_, T_}, DType::I64);
    annotate(ids, batch), annotate(positions, batch);
    return embed(ids, positions);
  }

  // Every block; `attend` gives each layer's context from its heads.
  graph::ValueId blocks(graph::ValueId x, const Attend& attend) {
    const int64_t H = c_.hidden, NH = c_.heads, HD = H / NH;
    for (int64_t l = part_.first_layer; l < part_.end(c_); ++l) {
      std::string p = fmt::format("transformer.h.{}", l);
      auto h = ln(x, p + ".ln_1");
      auto heads = [&](graph::ValueId t, const std::string& name) {
        return g_.transpose(g_.reshape(t, {B_, T_, NH, HD}, name + ".split"), {0, 2, 1, 3}, name + ".heads");
      };
      auto q = heads(linear(h, p + ".attn.q_proj", H, H, true), p + ".attn.q");
      auto k = heads(linear(h, p + ".attn.k_proj", H, H, true), p + ".attn.k");
      auto v = heads(linear(h, p + ".attn.v_proj", H, H, true), p + ".attn.v");
      auto q_scaled = g_.scale(q, 1.0 / std::sqrt(static_cast<double>(HD)), 0.0, p + ".attn.q.scaled");
      auto ctx_heads = attend(q_scaled, k, v, l);
      auto ctx = g_.reshape(g_.transpose(ctx_heads, {0, 2, 1, 3}, p + ".attn.ctx.t"), {B_, T_, H}, p + ".attn.ctx");
      x = g_.add(x, linear(ctx, p + ".attn.c_proj", H, H, false), p + ".attn.residual");
      auto h2 = ln(x, p + ".ln_2");
      auto m = linear(g_.gelu(linear(h2, p + ".mlp.c_fc", H, 4 * H, true), p + ".mlp.act"), p + ".mlp.c_proj", 4 * H,
                      H, false);
      x = g_.add(x, m, p + ".mlp.residual");
    }
    return x;
  }

  // logits [B, T', V] of hidden states [B, T', H] (the head tied to the token embedding).
  graph::ValueId head(graph::ValueId x, const std::string& name) {
    if (wte_ < 0) wte_ = param("transformer.wte.weight", Shape{c_.vocab, c_.hidden}, "S(0)");  // a last stage's copy
    return g_.matmul(ln(x, "transformer.ln_f"), wte_, true, name);
  }

 private:
  graph::ValueId param(const std::string& name, const Shape& shape, const char* on_tp = nullptr) {
    auto v = g_.param(name, shape, DType::F32);
    if (on_tp && s_.tp >= 0) annotate(v, s_.placements(on_tp));
    return v;
  }
  graph::ValueId ln(graph::ValueId in, const std::string& name) {
    auto w = param(name + ".weight", Shape{c_.hidden});
    auto b = param(name + ".bias", Shape{c_.hidden});
    return g_.layer_norm(in, w, b, -1, c_.layer_norm_epsilon, name + ".out");
  }
  // Column-parallel (weight S(1), bias S(0) on tp) or row-parallel (weight S(0)).
  graph::ValueId linear(graph::ValueId in, const std::string& name, int64_t n_in, int64_t n_out, bool column) {
    auto w = param(name + ".weight", Shape{n_in, n_out}, column ? "S(1)" : "S(0)");
    auto b = param(name + ".bias", Shape{n_out}, column ? "S(0)" : nullptr);
    return g_.add(g_.matmul(in, w, false, name + ".mm"), b, name + ".out");
  }

  const GptConfig& c_;
  const Strategy& s_;
  graph::Graph& g_;
  int64_t B_, T_;
  DecodePart part_;
  graph::ValueId wte_ = -1;
};

}  // namespace

void check_decoder_shape(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t length, const char* what) {
  c.validate();
  SW_CHECK(s.pp < 0, "a decoder graph runs on one pipeline stage's mesh; the mesh {} has a pp dim (the Generator "
                     "cuts a pp mesh into its stages' meshes)", s.mesh.to_string());
  SW_CHECK(c.heads % s.tp_size() == 0, "{} heads do not divide over tp={} (each tp rank needs whole heads)", c.heads,
           s.tp_size());
  SW_CHECK(sequences >= 1 && sequences % s.dp_size() == 0, "a batch of {} sequences does not divide over dp={}",
           sequences, s.dp_size());
  SW_CHECK(length >= 1 && length <= c.seq, "{} length {} is outside [1, {}] (the model's positions)", what, length,
           c.seq);
}

std::string kv_placements(const Strategy& s) { return s.placements("S(1)", "S(0)"); }

std::string stage_stream_placements(const Strategy& s) { return s.placements("R", "S(0)"); }

graph::ValueId stage_entry(graph::Graph& g, const Strategy& s, const DecodePart& part, Shape stream,
                           const std::function<graph::ValueId()>& embed) {
  if (part.embeddings) return embed();
  auto x = g.input("hidden", std::move(stream));
  if (s.mesh.ndim() > 0) g.annotate(x, stage_stream_placements(s));
  return x;
}

bool stage_exit(DecoderGraph& out, const Strategy& s, const DecodePart& part, graph::ValueId x) {
  if (part.head) return false;
  if (s.mesh.ndim() > 0) out.g.annotate(x, stage_stream_placements(s));
  out.hidden = out.g.value(x).name;
  out.logits.clear();
  return true;
}

DecoderGraph build_gpt_prefill(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t length,
                               const DecodePart& part) {
  check_decoder_shape(c, s, sequences, length, "a prefill");
  const int64_t B = sequences, T = length;
  DecoderGraph out;
  out.sequences = B, out.length = T;
  graph::Graph& g = out.g;
  Decoder d(c, s, g, B, T, part);
  const std::string batch = s.placements("R", "S(0)");
  auto mask = g.input("causal_mask", Shape{T, T});
  out.constants["causal_mask"] = causal_mask(T);
  d.annotate(mask, s.placements("R"));
  auto attend = [&](graph::ValueId q, graph::ValueId k, graph::ValueId v, int64_t l) {
    std::string p = fmt::format("transformer.h.{}.attn", l);
    out.present_k.push_back(g.value(k).name);
    out.present_v.push_back(g.value(v).name);
    auto key = k, value = v;
    d.annotate(key, kv_placements(s)), d.annotate(value, kv_placements(s));  // the cache's layout
    auto scores = g.matmul(q, key, true, p + ".scores");
    auto probs = g.softmax(g.add(scores, mask, p + ".masked"), -1, p + ".probs");
    return g.matmul(probs, value, false, p + ".ctx.heads");
  };
  auto x = d.blocks(stage_entry(g, s, part, Shape{B, T, c.hidden}, [&] { return d.embed_inputs(batch); }), attend);
  if (stage_exit(out, s, part, x)) return out;
  auto last = g.input("last", Shape{B, 1, T});
  d.annotate(last, batch);
  d.head(g.matmul(last, x, false, "last_hidden"), out.logits);
  return out;
}

DecoderGraph build_gpt_decode_step(const GptConfig& c, const Strategy& s, int64_t sequences, int64_t cache_length,
                                   const DecodePart& part) {
  check_decoder_shape(c, s, sequences, cache_length, "a KV cache");
  const int64_t B = sequences, C = cache_length, HD = c.head_size();
  DecoderGraph out;
  out.sequences = B, out.length = C;
  graph::Graph& g = out.g;
  Decoder d(c, s, g, B, 1, part);
  const std::string batch = s.placements("R", "S(0)");
  auto mask = g.input("cache_mask", Shape{B, 1, 1, C + 1});
  d.annotate(mask, batch);
  auto attend = [&](graph::ValueId q, graph::ValueId k, graph::ValueId v, int64_t l) {
    std::string p = fmt::format("transformer.h.{}.attn", l);
    out.past_k.push_back(fmt::format("past.{}.k", l));
    out.past_v.push_back(fmt::format("past.{}.v", l));
    out.present_k.push_back(g.value(k).name);
    out.present_v.push_back(g.value(v).name);
    auto past_k = g.input(out.past_k.back(), Shape{B, c.heads, C, HD});
    auto past_v = g.input(out.past_v.back(), Shape{B, c.heads, C, HD});
    auto key = k, value = v;
    for (auto t : {past_k, past_v, key, value}) d.annotate(t, kv_placements(s));
    auto keys = g.op1("concat", {past_k, key}, {{"axis", int64_t{2}}}, p + ".keys");
    auto values = g.op1("concat", {past_v, value}, {{"axis", int64_t{2}}}, p + ".values");
    auto scores = g.matmul(q, keys, true, p + ".scores");
    auto probs = g.softmax(g.add(scores, mask, p + ".masked"), -1, p + ".probs");
    return g.matmul(probs, values, false, p + ".ctx.heads");
  };
  auto x = d.blocks(stage_entry(g, s, part, Shape{B, 1, c.hidden}, [&] { return d.embed_inputs(batch); }), attend);
  if (stage_exit(out, s, part, x)) return out;
  d.head(x, out.logits);
  return out;
}

}  // namespace shardwise::train
