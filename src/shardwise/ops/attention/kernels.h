#pragma once
// Fused causal attention (FlashAttention-2, Dao 2023): softmax(q kᵀ · scale + mask) v computed tile
// by tile over the keys with an online softmax, so no [S, S] scores or probabilities are allocated
// whole; the forward also returns each query row's log-sum-exp, from which the backward recomputes
// the probabilities tile by tile (with delta_i = sum_d dO[i, d] O[i, d]).
//
// Layouts: q [B, H, S, D] with k, v [B, H, S, D]; or grouped-query q [B, G, R, S, D] with k, v
// [B, G, S, D] (query head h = g R + r reads kv head g, transformers' repeat_kv order). out is q's
// shape, lse q's shape without D (the compute type: f32 for f32 / f16 / bf16, f64 for f64).
// Key j is visible to query i iff j <= i and, with per-token document ids doc [B, S] (packed
// documents, data/packing.h), doc[b, j] == doc[b, i].
// Context parallelism: q may hold a block of the sequence, rows [query0, query0 + S) of the T keys
// (k, v [.., T, D] whole, doc [B, T]); query0 comes from q's shard offset. Ring attention (ring.h)
// also passes a block of keys, rows [key0, key0 + T) of a sequence of `seq` (doc [B, seq] whole); a
// query row that sees none of the block's keys gets out 0 and lse -inf. With balanced_ranks c > 1
// the sequence is stored in cp's load-balanced order (mesh/cp_order.h): token x sits at position
// cp_balanced_position(x, T, c), and the causal mask and the dropout key compare those positions.
// dk and dv are then this block's queries' contributions (Partial over the sequence's shards).
// Attention dropout draws exactly the mask the `dropout` op draws on the unfused probabilities
// [B, NH, S, S] (NH = G R global query heads): keep (b, h, i, j) iff Philox(seed, stream).uniform(
// ((b NH + h) S + i) S + j) >= p with global b (plus the micro-batch's sample offset) and h; kept
// probabilities are scaled by 1 / (1 - p).
// The kernels loop over (batch, kv head) blocks on the outside (each writes its own slices of
// every output, dk and dv included), so a thread pool can split that loop.
#include <cstdint>

#include "shardwise/core/attrs.h"
#include "shardwise/mesh/cp_order.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

struct AttentionArgs {
  double scale = 1.0;  // scores = (q scale) kᵀ
  double p = 0.0;      // attention dropout probability, in [0, 1)
  uint64_t seed = 0, stream = 0;
  bool training = true;
  int64_t balanced_ranks = 1;  // the sequence's order: cp's balanced order over this many ranks
  bool dropout() const { return training && p > 0.0; }
};
// Reads scale (float > 0, required), p (float in [0, 1), default 0), seed (int, required when
// p > 0), stream (int, default 0), training (bool, default true). Error names the attribute.
AttentionArgs attention_args(const Attrs& attrs);

// Where the local block sits among the global query heads and sequences (dropout's key): the
// global batch index of local row 0 (sample offset included), the global (G, R) of q and the
// offsets of local g and r. Single device: zeros and the local extents.
struct AttentionCoords {
  int64_t batch0 = 0;
  int64_t groups = -1, reps = -1;  // global G and R (-1: the local ones)
  int64_t group0 = 0, rep0 = 0;
  int64_t query0 = 0;  // the sequence index of local query row 0 (a sequence-sharded q)
  int64_t key0 = 0;    // the sequence index of local key row 0 (a ring's block of keys)
  int64_t seq = -1;    // the whole sequence's length (-1: k's rows, k holding the whole sequence)
};

// Error naming the op unless q, k, v (and doc when given) have the layouts above, floating q with
// k and v of its dtype, and doc i64. Global shapes (`local` null): k, v hold q's sequence; a
// kernel's local blocks (`local`: their coordinates): any block of keys, doc [B, local->seq].
void check_attention_inputs(const Shape& q, DType q_dtype, const Shape& k, DType k_dtype, const Shape& v,
                            DType v_dtype, const Shape* doc, DType doc_dtype, const AttentionCoords* local = nullptr);
Shape attention_lse_shape(const Shape& q);
DType attention_lse_dtype(DType q);

struct AttentionOutputs {
  Tensor out, lse;
};
// doc: undefined for plain causal attention.
AttentionOutputs flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                 const AttentionArgs& args, const AttentionCoords& coords = {});

struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                        const Tensor& out, const Tensor& lse, const Tensor& dout,
                                        const AttentionArgs& args, const AttentionCoords& coords = {});

}  // namespace shardwise::ops
