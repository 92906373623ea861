#pragma once
// The per-layer analytic step model `plan --auto` uses where compiling every candidate's programs
// would take too long (a cluster of more than kExactSearchDevices devices; docs/planner.md): the
// same pieces as the program model (plan/cost.h: peaks, links, rings, the pipeline simulator) over
// a transformer layer's counted work instead of a lowered program's instructions.
//
// Per device and micro-batch of b sequences of s tokens, hidden h, MLP width f, vocabulary V, tp t:
//   FLOPs, forward, a layer: 2bsh (h + 2 kv_heads head_dim) (q, k, v) + 2bsh^2 (attention output)
//     + 4bs^2 h (scores, probs x v) + (2 or 3 for SwiGLU) 2bshf (MLP), over t; the head 2bshV / t
//     on the last stage; the backward twice the forward; full recompute one forward more;
//   tp: 2 all-reduces of bsh activations a layer in the forward and 2 in the backward (with
//     sequence parallelism an all-gather and a reduce-scatter each, the same bytes), 2 more with
//     full recompute; over the tp group (inside a node: rule tp-node);
//   ep: 4 all-to-alls of the routed tokens (top_k bsh) an MoE layer over the ep group;
//   pp: one send of bsh activations per micro-batch and stage boundary;
//   data ranks, once a step (the gradient buckets): stages 0-1 an all-reduce of the f32 gradients,
//     stage 2 a reduce-scatter of them and an all-gather of the parameters; stage 3 an all-gather
//     of the parameters in the forward and again in the backward and a reduce-scatter of the
//     gradients every micro-batch;
//   the optimizer: AdamW's 7 f32 streams over the rank's parameters (its shard from stage 1);
//   memory: parameters (dtype bytes; shard from stage 3), f32 gradients (shard from stage 2), AdamW
//     moments (8 bytes, shard from stage 1), f32 masters for bf16 (as the moments), and
//     activations of the micro-batches in flight on the first pipeline rank (Korthikanti et al.
//     2022 with flash attention, no s^2 term: sbh (10 + 24 / t) a layer at 2 bytes, sbh 34 / t with
//     sequence parallelism; full recompute keeps a layer's input only, sbh, plus one layer's
//     activations while it is recomputed), scaled to the dtype.
// Every pipeline stage is given the slowest's (the last, with the head) times.
#include <cstdint>
#include <map>
#include <string>

#include "shardwise/plan/cluster.h"
#include "shardwise/plan/cost.h"
#include "shardwise/plan/estimate.h"
#include "shardwise/plan/search.h"

namespace shardwise::plan {

// Meshes of at most this many devices are searched with the compiled programs, larger ones with
// the analytic model.
inline constexpr int64_t kExactSearchDevices = 64;

struct ModelSize {
  int64_t layers = 1, heads = 1, kv_heads = 1, head_dim = 1, hidden = 1, mlp_width = 1, vocab = 1, seq = 1;
  int64_t experts = 0, top_k = 2;
  bool swiglu = false, tied = true;
  int64_t params() const;  // every parameter of the model
};

// The peak bytes of a device (the first or the last pipeline stage's, the larger).
int64_t analytic_memory(const ModelSize& m, const Candidate& c, int64_t global_batch, const std::string& dtype);
// The step; `timer` keeps the schedules it simulated for the next call (nullptr: a timer of its own).
StepEstimate analytic_estimate(const ClusterSpec& cluster, const ModelSize& m, const Candidate& c,
                               int64_t global_batch, const std::string& dtype, PipelineTimer* timer = nullptr);

}  // namespace shardwise::plan
