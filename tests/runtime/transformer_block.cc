#include "transformer_block.h"

#include <cmath>

#include "shardwise/core/philox.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise::testing_support {

void build_block(graph::Graph& g, const BlockConfig& c, const std::map<std::string, std::string>& placements) {
  const int64_t B = c.batch, S = c.seq, H = c.hidden, NH = c.heads, HD = H / NH, V = c.vocab;
  graph::ValueId x0, wte = -1;
  if (c.embedding) {
    auto ids = g.input("ids", Shape{B, S}, DType::I64);
    wte = g.param("wte", Shape{V, H});
    auto wpe = g.param("wpe", Shape{S, H});
    x0 = g.add(g.embedding(ids, wte, "tok"), wpe, "x0");
  } else {
    x0 = g.param("x", Shape{B, S, H});
  }
  auto mask = g.input("mask", Shape{S, S});
  auto linear = [&](graph::ValueId in, const std::string& name, int64_t n_in, int64_t n_out) {
    auto w = g.param(name + ".weight", Shape{n_in, n_out});
    auto b = g.param(name + ".bias", Shape{n_out});
    return g.add(g.matmul(in, w, false, name + ".mm"), b, name);
  };
  auto ln = [&](graph::ValueId in, const std::string& name) {
    auto s = g.param(name + ".scale", Shape{H});
    auto b = g.param(name + ".bias", Shape{H});
    return g.layer_norm(in, s, b, -1, 1e-5, name);
  };
  auto heads = [&](graph::ValueId t, const std::string& name) {  // [B,S,H] -> [B,NH,S,HD]
    return g.transpose(g.reshape(t, {B, S, NH, HD}, name + ".split"), {0, 2, 1, 3}, name + ".heads");
  };
  auto h1 = ln(x0, "ln1");
  auto q = heads(linear(h1, "q", H, H), "q"), k = heads(linear(h1, "k", H, H), "k"), v = heads(linear(h1, "v", H, H), "v");
  auto scores = g.scale(g.matmul(q, k, true, "qk"), 1.0 / std::sqrt(static_cast<double>(HD)), 0.0, "scores");
  auto probs = g.softmax(g.add(scores, mask, "masked"), -1, "probs");
  auto ctx = g.reshape(g.transpose(g.matmul(probs, v, false, "ctx.heads"), {0, 2, 1, 3}, "ctx.t"), {B, S, H}, "ctx");
  auto x1 = g.add(x0, linear(ctx, "attn_out", H, H), "x1");
  auto h2 = ln(x1, "ln2");
  auto m = linear(g.gelu(linear(h2, "fc1", H, 4 * H), "act"), "fc2", 4 * H, H);
  auto x2 = g.add(x1, m, "x2");
  if (c.embedding) {
    auto labels = g.input("labels", Shape{B, S}, DType::I64);
    auto logits = g.matmul(ln(x2, "ln_f"), wte, true, "logits");
    g.op1(c.vocab_parallel_loss ? "vocab_parallel_cross_entropy" : "cross_entropy", {logits, labels},
          {{"reduction", std::string("mean")}}, "loss");
  } else {
    g.mean(g.multiply(x2, x2, "x2sq"), {}, false, "loss");
  }
  for (const auto& [name, p] : placements) g.annotate(g.get(name), p);
}

std::map<std::string, Tensor> block_data(const BlockConfig& c) {
  graph::Graph g;
  build_block(g, c, {});
  std::map<std::string, Tensor> data;
  uint64_t stream = 1;
  for (const graph::Value& v : g.values()) {
    if (v.producer >= 0) continue;
    ops::ValueGen gen;
    if (v.name == "ids" || v.name == "labels") {
      gen.kind = ops::ValueGen::Kind::Index, gen.lo = 0, gen.hi = static_cast<double>(c.vocab - 1);
    } else if (v.name.ends_with(".scale")) {
      gen.lo = 0.8, gen.hi = 1.2;
    } else {
      gen.lo = -0.3, gen.hi = 0.3;
    }
    Tensor t = verify::random_tensor(v.meta.shape, v.meta.dtype, gen, Philox(21, stream++));
    if (v.name == "mask") {  // causal: 0 on and below the diagonal, -1e4 above
      for (int64_t i = 0; i < c.seq; ++i)
        for (int64_t j = 0; j < c.seq; ++j) t.set_at(i * c.seq + j, j <= i ? 0.0 : -1e4);
    }
    data[v.name] = t;
  }
  return data;
}

}  // namespace shardwise::testing_support
