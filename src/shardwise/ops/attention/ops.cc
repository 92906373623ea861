// The attention family's registry entries: flash_attention(q, k, v) and flash_attention_docs(q, k,
// v, document ids) (kernels.h; rules in rules.cc) and their verification cases. Outputs (out, lse).
// Attributes: scale (float, required: 1/sqrt(head dim)), p (attention dropout, default 0), seed
// (int, required with p > 0), stream (int, default 0), training (bool, default true),
// balanced_ranks (int, default 1: the sequence in cp's load-balanced order over that many ranks).
#include "shardwise/core/error.h"
#include "shardwise/ops/attention/kernels.h"
#include "shardwise/ops/attention/ring.h"
#include "shardwise/ops/attention/rules.h"
#include "shardwise/ops/families.h"

namespace shardwise::ops {

namespace {

// Where the local q block sits (dropout's key): from q's entry of the context (index 0 in the
// forward and the backward), the batch offset counting the micro-batch's first sample.
AttentionCoords coords_of(const KernelContext& ctx) {
  SW_CHECK(!ctx.tensors.empty(), "flash_attention: the kernel context has no entry for q");
  SW_CHECK(ctx.sample_offset >= 0, "flash_attention: a negative sample offset {}", ctx.sample_offset);
  const ShardInfo& q = ctx.tensors[0];
  AttentionCoords c;
  c.batch0 = q.offset[0] + ctx.sample_offset;
  c.groups = q.global_shape[1];
  c.group0 = q.offset[1];
  if (q.global_shape.ndim() == 5) {
    c.reps = q.global_shape[2];
    c.rep0 = q.offset[2];
  }
  c.query0 = q.offset[static_cast<size_t>(q.global_shape.ndim() - 2)];  // a sequence-sharded q's first row
  return c;
}

// q [B, H, S, D] (k, v alike) or, with `groups` > 0, q [B, groups, H / groups, S, D] and k, v
// [B, groups, S, D]; f64 values; `docs`: ids [B, S] in [0, 2] (several documents per row).
VerifyCase attention_case(int64_t B, int64_t H, int64_t S, int64_t D, int64_t groups, bool docs, DType dtype = DType::F64,
                          double p = 0.0, int64_t balanced_ranks = 1) {
  Attrs a{{"scale", 0.5}};
  if (balanced_ranks > 1) a.set("balanced_ranks", balanced_ranks);
  if (p > 0) {
    a.set("p", p);
    a.set("seed", int64_t{7});
    a.set("stream", int64_t{3});
  }
  const Shape q = groups > 0 ? Shape{B, groups, H / groups, S, D} : Shape{B, H, S, D};
  const Shape kv{B, groups > 0 ? groups : H, S, D};
  VerifyCase c{{q, kv, kv}, {dtype, dtype, dtype}, a, {ValueGen{}, ValueGen{}, ValueGen{}}};
  if (docs) {
    c.shapes.push_back(Shape{B, S});
    c.dtypes.push_back(DType::I64);
    c.values.push_back(ValueGen{ValueGen::Kind::Index, 0, 2});
  }
  return c;
}

OpDef make_attention(bool docs) {
  OpDef op;
  op.name = docs ? "flash_attention_docs" : "flash_attention";
  op.family = "attention";
  op.rule = docs ? rules_of<attention_rules>().flash_attention_docs : rules_of<attention_rules>().flash_attention;
  op.summary = docs ? "(out, lse) = flash_attention_docs(q, k, v, doc [B, S] i64): flash_attention where key j is also "
                      "visible to query i only when doc[b, j] == doc[b, i] (packed documents)"
                    : "(out, lse) = flash_attention(q [B,H,S,D] or [B,G,R,S,D], k, v [B,H|G,S,D]; scale, p, seed, "
                      "stream): causal softmax((q scale) k^T) v tiled over keys with an online softmax (no [S, S] "
                      "buffer), lse = per-row log-sum-exp; attention dropout keyed as the dropout op's on the "
                      "probabilities [B, NH, S, S]. Gradient recomputed tile by tile from lse";
  op.num_inputs = docs ? 4 : 3;
  op.num_outputs = 2;
  op.infer = [docs](std::span<const TensorMeta> in, const Attrs& attrs) {
    attention_args(attrs);
    check_attention_inputs(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype, in[2].shape, in[2].dtype,
                           docs ? &in[3].shape : nullptr, docs ? in[3].dtype : DType::I64);
    return std::vector<TensorMeta>{in[0], {attention_lse_shape(in[0].shape), attention_lse_dtype(in[0].dtype)}};
  };
  op.forward_in_context = [docs](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    AttentionOutputs r =
        flash_attention(in[0], in[1], in[2], docs ? in[3] : Tensor(), attention_args(attrs), coords_of(ctx));
    return std::vector<Tensor>{r.out, r.lse};
  };
  op.backward_in_context = [docs](std::span<const Tensor> in, std::span<const Tensor> out,
                                  std::span<const Tensor> dout, const Attrs& attrs, const KernelContext& ctx) {
    AttentionGrads g = flash_attention_backward(in[0], in[1], in[2], docs ? in[3] : Tensor(), out[0], out[1], dout[0],
                                                attention_args(attrs), coords_of(ctx));
    std::vector<Tensor> r{g.dq, g.dk, g.dv};
    if (docs) r.emplace_back();
    return r;
  };
  // Every dim dividing every test mesh size (12), dims dividing its dims (12, 6), uneven ones (5, 7), dims smaller than the mesh (1, 2:
  // empty shards); grouped-query layouts; dropout; one f32 case; the balanced order. S and D stay small: the verifier
  // runs the kernels once per distinct layout.
  if (docs) {
    op.cases = {attention_case(12, 12, 12, 12, 0, true), attention_case(12, 6, 5, 2, 0, true),
                attention_case(5, 7, 4, 3, 0, true),
                attention_case(1, 2, 6, 2, 0, true), attention_case(6, 6, 5, 2, 3, true),
                attention_case(4, 6, 7, 2, 6, true, DType::F64, 0.3), attention_case(2, 4, 3, 2, 2, true, DType::F32),
                attention_case(2, 4, 5, 2, 2, true, DType::BF16),
                attention_case(2, 2, 6, 2, 0, true, DType::F64, 0.0, 3)};
  } else {
    op.cases = {attention_case(12, 12, 12, 12, 0, false),
                attention_case(12, 6, 5, 2, 0, false),
                attention_case(5, 7, 4, 3, 0, false),
                attention_case(1, 2, 3, 2, 0, false),
                attention_case(6, 12, 4, 2, 6, false),
                attention_case(2, 6, 5, 2, 2, false),
                attention_case(6, 6, 7, 2, 0, false, DType::F64, 0.3),
                attention_case(2, 6, 4, 2, 3, false, DType::F64, 0.25),
                attention_case(3, 4, 5, 2, 0, false, DType::F32),
                attention_case(2, 6, 5, 2, 2, false, DType::BF16),  // --compute bf16: f32 math, bf16 out
                attention_case(2, 4, 8, 2, 2, false, DType::F64, 0.2, 2)};
  }
  return op;
}

// ring_attention(_docs): flash_attention's entry with the ring's kernels (ring.h) on the group
// sharding q's sequence (collective), the whole sequence's length from q's global shape.
OpDef make_ring(bool docs) {
  OpDef op = make_attention(docs);
  op.name = docs ? "ring_attention_docs" : "ring_attention";
  op.rule = docs ? rules_of<attention_rules>().ring_attention_docs : rules_of<attention_rules>().ring_attention;
  op.summary = docs ? "(out, lse) = ring_attention_docs(q, k, v, doc [B, S] i64 whole): ring_attention with packed "
                      "documents' mask"
                    : "(out, lse) = ring_attention(q, k, v; flash_attention's attributes): flash_attention with q, k, v "
                      "sharded alike on the sequence; k/v blocks pass around the ring of ranks sharding it "
                      "(send/recv), the blocks' outputs merged by their lse; the backward sends dk/dv around";
  op.collective = true;
  op.forward_in_context = [docs](std::span<const Tensor> in, const Attrs& attrs, const KernelContext& ctx) {
    const RingPlace at = ring_place(in, &ctx);
    AttentionOutputs r = ring_attention(in[0], in[1], in[2], docs ? in[3] : Tensor(), attention_args(attrs), at.coords,
                                        at.ring);
    return std::vector<Tensor>{r.out, r.lse};
  };
  op.backward_in_context = [docs](std::span<const Tensor> in, std::span<const Tensor> out,
                                   std::span<const Tensor> dout, const Attrs& attrs, const KernelContext& ctx) {
    const RingPlace at = ring_place(in, &ctx);
    AttentionGrads g = ring_attention_backward(in[0], in[1], in[2], docs ? in[3] : Tensor(), out[0], out[1], dout[0],
                                               attention_args(attrs), at.coords, at.ring);
    std::vector<Tensor> r{g.dq, g.dk, g.dv};
    if (docs) r.emplace_back();
    return r;
  };
  // Fewer and smaller cases than flash_attention's (each layout runs the ring on threads): even,
  // uneven and empty shards, grouped heads, dropout, the balanced order, f32.
  op.cases = {attention_case(12, 12, 12, 12, 0, docs),
              attention_case(5, 7, 5, 3, 0, docs),
              attention_case(1, 2, 3, 2, 0, docs),
              attention_case(6, 12, 4, 2, 6, docs),
              attention_case(6, 6, 7, 2, 0, docs, DType::F64, 0.3),
              attention_case(2, 4, 12, 2, 2, docs, DType::F64, 0.2, 3),
              attention_case(3, 4, 5, 2, 0, docs, DType::F32),
              attention_case(3, 4, 5, 2, 0, docs, DType::BF16)};
  return op;
}

}  // namespace

// The group sharding q's sequence, and the whole sequence's length from q's global shape.
RingPlace ring_place(std::span<const Tensor> inputs, const KernelContext* ctx) {
  const KernelContext single = ctx ? KernelContext{} : KernelContext::single_device(inputs);
  const KernelContext& c = ctx ? *ctx : single;
  const Shape& q = c.tensors.at(0).global_shape;
  RingPlace at{coords_of(c), c.group_sharding(0, 1u << (q.ndim() - 2), "ring_attention")};
  at.coords.seq = q[q.ndim() - 2];
  return at;
}

void register_attention_ops(OpRegistry& registry) {
  registry.add(make_attention(false));
  registry.add(make_attention(true));
  registry.add(make_ring(false));
  registry.add(make_ring(true));
}

}  // namespace shardwise::ops
