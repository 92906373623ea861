// SPMD rules of flash_attention(q, k, v) and flash_attention_docs(q, k, v, doc), derived from one
// factor description (spmd/factor_rule.h). Labels: q [b, h, s, d] with k, v [b, h, t, d], or
// grouped q [b, g, r, s, d] with k, v [b, g, t, d]; out is q's labels, lse q's without d; document
// ids [b, t]. So:
//  - the batch b is kept (dp), and so are the query heads: h (or g, r) shard out and lse as they
//    shard q; a sharded kv group g shards q's g and k, v's together (each rank holds whole groups:
//    the query heads of a group read its kv head), and a sharded r leaves k, v whole there (GQA with
//    kv replicated over tp when tp does not divide the kv heads);
//  - the query sequence s is kept (context parallelism: each rank attends its block of queries,
//    the kernel reading the block's offset from q's shard); the key sequence t and the head dim d
//    are replicated factors (every query needs the whole sequence of keys, so a sequence-sharded
//    k, v are all-gathered: the all-gather variant of context parallelism). t is on no output, so
//    the grad gives dk, dv Partial(sum) over a mesh dim sharding s (each block's queries' share),
//    which a sequence-sharded k, v reduce-scatter back.
// ring_attention(q, k, v[, doc]) labels k, v's sequence with q's letter s: a mesh dim sharding it
// shards all three alike (each rank holds a block of queries and the same block of keys, which
// travels the ring), so dk, dv follow k, v (no Partial); the document ids [b, u] stay whole (u
// replicated: every rank masks any block against its rows).
// Partials: softmax is not linear in q, k or v, so every Partial input is resharded to R (forward,
// reverse); the grad part lets none through either (dout's Partial would pass linearly, but
// delta = rowsum(dout * out) is computed from the whole dout).
// Grad: the kernel reads q, k, v, the document ids, out and lse; the ids and lse take no gradient.
#include "shardwise/ops/attention/rules.h"

#include "shardwise/core/error.h"
#include "shardwise/spmd/factor_rule.h"

namespace shardwise::ops {
using namespace spmd;

namespace {

Labels labels(std::string_view s) {
  Labels l;
  for (char c : s) l.push(c);
  return l;
}

// flash_attention's labels (k, v's sequence t, ids [b, t]) or, `ring`, ring_attention's (k, v's
// sequence q's s, ids [b, u] whole).
Factors describe_labels(std::span<const TensorSpec> in, bool ring) {
  const Shape& q = in[0].shape;
  SW_CHECK(q.ndim() == 4 || q.ndim() == 5, "rule '{}': q must be [B, H, S, D] or [B, G, R, S, D], got {}",
           ring ? "ring_attention" : "flash_attention", q.to_string());
  const bool grouped = q.ndim() == 5;
  const char* k = ring ? (grouped ? "bgsd" : "bhsd") : (grouped ? "bgtd" : "bhtd");
  const Labels ql = labels(grouped ? "bgrsd" : "bhsd"), kl = labels(k);
  Shape lse;
  for (int i = 0; i + 1 < q.ndim(); ++i) lse.push_back(q[i]);
  Factors f;
  f.add_input(ql);
  f.add_input(kl);
  f.add_input(kl);
  if (in.size() == 4) f.add_input(labels(ring ? "bu" : "bt"));
  f.add_output(ql, q);
  f.add_output(labels(grouped ? "bgrs" : "bhs"), lse);
  f.replicated = labels(ring ? "du" : "td");
  return f;
}
Factors describe(std::span<const TensorSpec> in, const Attrs&) { return describe_labels(in, false); }
Factors describe_ring(std::span<const TensorSpec> in, const Attrs&) { return describe_labels(in, true); }

// No Partial passes anywhere (the default choice: operands resharded to R, results R).
void no_partials(std::span<const Placement>, std::span<const TensorSpec>, const Attrs&, PartialChoice&) {}

Rule make(const char* name, int inputs, const char* summary, bool ring = false) {
  FactorRule r;
  r.name = name;
  r.summary = summary;
  r.num_inputs = inputs;
  r.describe = ring ? describe_ring : describe;
  r.forward_partials = no_partials;
  r.reverse_partials = no_partials;
  r.grad_partials = no_partials;
  r.no_grad = inputs == 4 ? 0b1000u : 0u;  // the document ids
  r.no_grad_outputs = 0b10;                 // lse
  return derive_rule(std::move(r));
}

}  // namespace

AttentionRules attention_rules() {
  AttentionRules r;
  r.flash_attention = make("flash_attention", 3,
                           "q [b,h,s,d] or [b,g,r,s,d], k/v [b,h|g,t,d]: batch, heads and the query sequence kept (kv "
                           "groups shard with q's; cp: s sharded, k/v gathered), t/d replicated; every Partial -> R. "
                           "Grad reads everything, dk/dv P(sum) over s's shards");
  r.flash_attention_docs = make("flash_attention_docs", 4,
                                "flash_attention's labels plus document ids [b,t] (batch kept with q's, t "
                                "replicated); ids and lse take no gradient; every Partial -> R");
  r.ring_attention = make("ring_attention", 3,
                          "q [b,h,s,d] or [b,g,r,s,d], k/v [b,h|g,s,d]: batch, heads and the sequence kept, q's and "
                          "k/v's sequence sharded alike (the kernel passes k/v around the ring), d replicated; every "
                          "Partial -> R; dk/dv follow k/v",
                          true);
  r.ring_attention_docs = make("ring_attention_docs", 4,
                               "ring_attention's labels plus document ids [b,u] (u replicated: whole on every rank)",
                               true);
  return r;
}

}  // namespace shardwise::ops
