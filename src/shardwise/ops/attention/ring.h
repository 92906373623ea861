#pragma once
// Ring attention (context parallelism without gathering the sequence): q, k, v are sharded on their
// sequence dim over a ring of ranks (the cp group). Each rank keeps its query block and passes its
// key/value block around the ring: at step t it attends its queries to the block that started t
// ranks before it (flash_attention on a key block, kernels.h: AttentionCoords::key0), merging the
// blocks' partial outputs by their log-sum-exps (the online softmax across blocks), while the next
// block travels. The backward passes (k, v, dk, dv) around the ring once more: each rank adds its
// queries' share of the travelling block's dk, dv, and after a full turn every block is back home
// with its whole gradient; dq stays local. Document ids (packed documents) are whole on every rank
// ([B, T]). Blocks may differ in length (uneven or empty shards): their offsets and lengths are
// gathered over the ring once per call.
//
// Transfers: started point-to-point sends and receives on the ring's communicator
// (Communicator::start_send / start_recv), one tag per kind of block. The forward starts step
// t + 1's k and v before it computes step t's tile and waits for them after; the backward also
// starts the next k and v first, and passes each step's dk, dv on as soon as they are added to,
// waiting for them at the next step after its tile. The merge order, and so every bit of the
// result, is that of computing the steps one after another. Where the backend makes started calls
// at their wait (the default), even ranks wait for their send first and odd ones for their receive,
// so no two ranks wait on each other.
#include "shardwise/comm/communicator.h"
#include "shardwise/ops/attention/kernels.h"

namespace shardwise::ops {

// `ring`: the group sharding the sequence (null: one rank, plain flash_attention). `coords`: the
// local block's coordinates (query0: its first row; seq: the whole sequence's length).
AttentionOutputs ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                const AttentionArgs& args, const AttentionCoords& coords, comm::Communicator* ring);
AttentionGrads ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       const AttentionArgs& args, const AttentionCoords& coords,
                                       comm::Communicator* ring);

}  // namespace shardwise::ops
