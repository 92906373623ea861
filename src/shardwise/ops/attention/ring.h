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
//
// On a device: the ring runs on device tensors with a device table's pieces (RingKernels: the block
// kernels, the log-sum-exp merge, the sums, casts and fills), and its transfers are device-buffer
// calls (a comm::DeviceBuffers scope on the thread's current stream around each start and wait),
// with the same steps and merge order as on the host, so the same bits where the pieces compute
// the host's bits (the fake device's run the CPU kernels).
#include <functional>

#include "shardwise/comm/communicator.h"
#include "shardwise/ops/attention/kernels.h"
#include "shardwise/ops/op.h"

namespace shardwise::ops {

// What the ring computes with, on tensors of `device` (the host: host_ring_kernels()). The running
// output, lse and gradient sums are of the compute dtype (attention_lse_dtype of q's).
struct RingKernels {
  Device device;
  // flash_attention / flash_attention_backward on one block of keys (coords.key0, coords.seq).
  std::function<AttentionOutputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                 const AttentionArgs&, const AttentionCoords&)>
      forward;
  std::function<AttentionGrads(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, const AttentionArgs&, const AttentionCoords&)>
      backward;
  // merge_block and add_block below, in place.
  std::function<void(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b)> merge;
  std::function<void(Tensor& acc, const Tensor& x)> add;
  std::function<Tensor(const Tensor&, DType)> cast;             // a converting copy (Tensor::to)
  std::function<Tensor(DType, const Shape&, double)> full;      // a filled tensor
};
const RingKernels& host_ring_kernels();

// The host's pieces, which device tables run on their own memory: a block's (out_b, lse_b), both of
// the compute dtype, merged into the running (out, lse): lse' = logaddexp(lse, lse_b), out' =
// exp(lse - lse') out + exp(lse_b - lse') out_b, rows whose lse_b is -inf (no visible key) left
// alone; and acc += x (one shape, the compute dtype).
void merge_block(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
void add_block(Tensor& acc, const Tensor& x);

// Where the ring op's local block sits and its ring (the group sharding q's sequence; null on one
// device), from its kernel context (ops.cc); null context: one device.
struct RingPlace {
  AttentionCoords coords;
  comm::Communicator* ring = nullptr;
};
RingPlace ring_place(std::span<const Tensor> inputs, const KernelContext* ctx);

// `ring`: the group sharding the sequence (null: one rank, plain flash_attention). `coords`: the
// local block's coordinates (query0: its first row; seq: the whole sequence's length).
AttentionOutputs ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                const AttentionArgs& args, const AttentionCoords& coords, comm::Communicator* ring,
                                const RingKernels& kernels = host_ring_kernels());
AttentionGrads ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       const AttentionArgs& args, const AttentionCoords& coords,
                                       comm::Communicator* ring, const RingKernels& kernels = host_ring_kernels());

}  // namespace shardwise::ops
