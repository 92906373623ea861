#pragma once
// The per-layer analytic step model `plan --auto` uses where compiling every candidate's programs
// would take too long (a cluster of more than kExactSearchDevices devices; docs/planner.md): the
// same pieces as the program model (plan/cost.h: peaks, links, rings, the pipeline simulator) over
// a transformer layer's counted work instead of a lowered program's instructions. Equation numbers
// are Narayanan et al., SC'21 (arXiv 2104.04473), "N"; Korthikanti et al. 2022 (arXiv 2205.05198), "K".
//
// Per device and micro-batch of b sequences of s tokens (s / cp of them on a device with cp), hidden
// h, a heads of head_dim d (kv of them for keys and values), MLP width f, vocabulary V, tp t:
//   FLOPs, forward, a layer: 2bs (h (a + 2 kv) d + a d h) (q, k, v, output) + (2 or 3 for SwiGLU)
//     2bshf (MLP), over t; attention's scores and probs x V 4 b s^2 a d / t: all of it with the
//     unfused core (it computes the whole [s, s] scores), half with the fused one (its causal tiles
//     only; cp's balanced order gives each cp rank the same share); the head 2bshV / t on the last
//     stage; the backward twice the forward; full recompute one forward of the layers more (N eq. 3
//     counts the same: 96 B s l h^2 (1 + s / 6h + V / 16 l h) with the unfused core);
//   memory-bound kernels (norms, softmax, dropout, activations, residuals): each byte of a layer's
//     activations (below) written once and read once in the forward, twice that in the backward, at
//     the memory bandwidth times the memory factor;
//   tp: 2 all-reduces of bsh activations a layer in the forward and 2 in the backward (with
//     sequence parallelism an all-gather and a reduce-scatter each, the same bytes), 2 more with
//     full recompute; over the tp group (inside a node: rule tp-node);
//   cp: the keys and values of a layer (b s 2 kv d / t) passed around the cp ring (an all-gather's
//     bytes) in the forward, twice in the backward (k, v again and their gradients back), once more
//     with full recompute; over the cp group (ranks tp apart), not overlapped with the attention;
//   ep: 4 all-to-alls of the routed tokens (top_k bsh) an MoE layer over the ep group;
//   pp: one message of bsh activations per micro-batch, virtual stage and direction; with tp the
//     scatter/gather of N section 4.1: each tp rank sends its 1/t over its own inter-node link, then
//     an all-gather over the tp group (inside the node) rebuilds it (with sequence parallelism the
//     activations are already split: 1/t and no all-gather);
//   data ranks (dp x ep x cp), once a step, not overlapped with the backward (as Megatron-LM did
//     when N was written): stages 0-1 an all-reduce of the f32 gradients, stage 2 a reduce-scatter of
//     them and an all-gather of the parameters; stage 3 an all-gather of the parameters in the
//     forward and again in the backward and a reduce-scatter of the gradients every micro-batch;
//     with pp and tied embeddings, the first and last stages' all-reduce of the embedding's gradient;
//   the optimizer: AdamW's 7 f32 streams over the rank's parameters (its shard from stage 1);
//   memory: parameters (dtype bytes; shard from stage 3), f32 gradients (shard from stage 2), AdamW
//     moments (8 bytes, shard from stage 1), f32 masters for bf16 (as the moments), and
//     activations of the micro-batches in flight on the first pipeline rank (K eq. 2 at 2 bytes:
//     sbh (10 + (8 + 4 f / h) / t) a layer, 8 f / h for SwiGLU's three MLP outputs and product,
//     sbh (18 + 4 f / h) / t with sequence parallelism (K eq. 5), plus 5 a s^2 b / t for the unfused
//     core's scores, mask and probabilities; full recompute keeps a layer's input only, sbh, plus
//     one layer's activations while it is recomputed), at kActivationBytes an element whatever the
//     dtype under f32 compute: shardwise's kernels then compute and keep activations in f32
//     (--bf16 stores the parameters only; the memory-bound traffic above stays at the dtype's
//     bytes, as Megatron-LM moves them); without recompute and with 16-bit parameters, each
//     micro-batch in flight also keeps the f32 copy of its layers' weights that their backward
//     reads (the cast the kernels read), 4 bytes a parameter; with sequence parallelism the
//     all-gathered inputs of the q/k/v and the MLP's first matmuls are kept whole, 2 sbh (1 - 1/t)
//     more than K's shards (the compiled programs' memory plan holds all three; BENCHMARKS.md).
//     Under bf16 compute what the runtime's frames keep, counted tensor by tensor (analytic.cc:
//     bf16_compute_activations): the GEMMs' operands in bf16, the residual stream, the norms'
//     kept outputs and the MLP's activation input in f32, no weight copy (bf16 parameters are read
//     as stored; f32 ones keep a bf16 copy, 2 bytes a parameter), and with sequence parallelism
//     no gathered input (gathered again in the backward).
// A pipeline rank holds ceil(layers / (pp x virtual)) layers a virtual stage (the slowest rank's,
// as Llama 3's 126 layers on 16 stages); the schedule is simulated with those layers' times, and
// the last stage's head adds its time once per micro-batch (in the steady state the last stage
// paces the pipeline: m (f + b + head) + the others' warm-up and drain).
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "shardwise/plan/cluster.h"
#include "shardwise/plan/cost.h"
#include "shardwise/plan/estimate.h"
#include "shardwise/plan/search.h"

namespace shardwise::plan {

// Meshes of at most this many devices are searched with the compiled programs, larger ones with
// the analytic model.
inline constexpr int64_t kExactSearchDevices = 64;
// Bytes of an activation element in memory: shardwise's kernels compute in f32 under --bf16 too.
inline constexpr double kActivationBytes = 4;

struct ModelSize {
  int64_t layers = 1, heads = 1, kv_heads = 1, head_dim = 1, hidden = 1, mlp_width = 1, vocab = 1, seq = 1;
  int64_t experts = 0, top_k = 2;
  bool swiglu = false, tied = true;
  // The attention core: fused (flash attention: the causal tiles only, nothing [s, s] kept) or
  // unfused (the whole [s, s] scores computed, and their softmax and dropout kept: --attention unfused).
  bool fused_attention = true;
  // --compute bf16: the GEMMs' and attention's operands in bf16 (their rate is the bf16 peak's,
  // and a frame keeps those operands in bf16; analytic.cc: bf16_compute_activations); else they
  // compute in f32 whatever the parameters' dtype.
  bool bf16_compute = false;
  int64_t params() const;  // every parameter of the model
};

// The dtype whose rate the GEMMs run at (cost.h: gemm_rate_dtype of bf16 compute).
std::string gemm_dtype(const ModelSize& m, const std::string& dtype);

// The peak bytes of a device (the first or the last pipeline stage's, the larger).
int64_t analytic_memory(const ModelSize& m, const Candidate& c, int64_t global_batch, const std::string& dtype);
// What the search keeps between candidates: each schedule generated once, and each simulated step
// by its inputs (candidates that differ only in sharding stage simulate the same pipeline).
struct AnalyticTimer {
  PipelineTimer schedules;
  std::map<std::tuple<std::string, int, int, int, double, double, double>, double> steps;
  double step(const std::string& schedule, int stages, int micro_batches, int virtual_stages, double forward,
              double backward, double send);
};

// The step; `timer` keeps the schedules and steps it simulated for the next call (nullptr: its own).
// With `split_sends` the schedule is simulated twice, with and without the pipeline's messages, to
// report their wait ("pp_send") apart from the bubble; without (the search), "bubble" holds both.
StepEstimate analytic_estimate(const ClusterSpec& cluster, const ModelSize& m, const Candidate& c,
                               int64_t global_batch, const std::string& dtype, AnalyticTimer* timer = nullptr,
                               bool split_sends = true);

}  // namespace shardwise::plan
