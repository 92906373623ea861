#pragma once
// The memory plan of a training run (`shardwise plan --memory`, `train --dry-run`, the refusal of a
// run that will not fit --memory-limit): per rank, the bytes of each part of the state a Trainer
// holds, computed without allocating a parameter or reading data.
//
//   parameters   this rank's blocks of every parameter of its stages (trained and frozen), in their
//                dtype (each once: the tied embedding's second local copy is the same tensor)
//   gradients    the f32 sums over the micro-batches, one per parameter of each local stage's graph,
//                held from the first backward to the optimizer step (stage 2: until the
//                reduce-scatter, after which `grad_shards` stay; stage 2 with the buckets reduced
//                during the backward and one micro-batch: the most the buckets hold, replayed
//                with the backward inside `working`)
//   optimizer    the AdamW moments: 8 bytes an element of the block, or of the rank's shard of it
//                (sharding stages 1, 2: train/sharding.h's plan_shards, the same ranges; stage 3: the
//                block is the shard, as are the parameters and gradients)
//   masters      the fp32 masters of bf16 parameters (whole blocks, or the shards); none for f32
//   activations  the most bytes the micro-batches in flight hold at once between their forward and
//                backward (what the runner measures as StepStats::peak_activation_bytes)
//   working      the most bytes in use during one compute action beyond the parameters: the other
//                micro-batches' frames plus the running action's buffers (reshards and kernel outputs
//                included); `gathered`: of it, stage 3's all-gathered parameter copies at most; at
//                sharding stages 1-2 also the optimizer's reduce after the backward (every full sum
//                beside the rank's ranges of them)
//   comm         the pipeline's point-to-point buffers: a stage's outgoing activation and incoming
//                gradient (and the other way round) of one micro-batch
//   peak         parameters + gradients + optimizer + masters + working + comm
//
// Activations are computed exactly as the runtime keeps them: each stage graph is built, completed,
// lowered and ordered as the runner compiles it (pipeline::compile_stage), and the runtime's buffer
// lifetimes are replayed over the lowered program's slots (last use in the execution order, the
// values kept, the ones the backward reads only the shape of released, the stage output dropped
// once sent), each slot's bytes being this rank's block of it. The schedule's own action list then
// gives the micro-batches in flight: a forward adds its frame, a backward frees it, a split
// schedule's input gradient keeps the weight gradient's part.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

// A tensor one micro-batch's frame keeps from its forward for its backward (`plan --memory --kept`).
struct KeptTensor {
  std::string name;     // the value's name
  int64_t bytes = 0;    // this rank's block of it
  std::string read_by;  // its first reader after the forward: "<op> backward", "<op> recomputed" or "reshard"
  int stage = 0;        // the pipeline stage (interleaved: the chunk) whose frame keeps it
};

struct RankMemory {
  int64_t rank = 0;           // process index in the mesh
  int pipeline_rank = 0;
  int64_t params = 0, grads = 0, grad_shards = 0, optimizer = 0, masters = 0;
  int64_t activations = 0;    // peak of the frames in flight
  int in_flight = 0;          // micro-batches in flight at most
  int64_t working = 0, comm = 0;
  int64_t gathered = 0;       // of working: the most bytes of all-gathered parameter copies (stage 3)
  // One micro-batch with f32 gradients: the runner's sums are the backward's own gradient buffers
  // (PipelineRunner::accumulate takes them), already inside `working`; not added twice.
  bool grads_in_working = false;
  // Stage 2 with --overlap-grad-reduce on and one micro-batch (no pp): each gradient goes to the
  // buckets once computed and its buffer is freed; `working` replays the buckets' bytes with the
  // backward's (grads_in_working) and `grads` is the most the buckets hold (GradBuckets's
  // last_peak_bytes: sums, packed copies, received and reduced ranges).
  bool grads_bucketed = false;
  int64_t peak() const { return params + (grads_in_working ? 0 : grads) + optimizer + masters + working + comm; }
  // With plan_memory's `list_kept`: what one micro-batch's frame of each local stage keeps after
  // its forward (its `frame`: parameters and constants excluded), largest first.
  std::vector<KeptTensor> kept;
};

struct MemoryPlan {
  std::vector<RankMemory> ranks;  // every rank of the mesh, by process index (symmetric: see below)
  // Only the first rank of each pipeline rank planned, each standing for the `ranks_each` ranks of
  // its pipeline rank (plan_memory's `symmetric`).
  bool symmetric = false;
  int64_t ranks_each = 1;
  bool threads = true;            // ranks as threads of one process (else one rank per MPI process)
  std::string description;        // model, mesh, batch, sharding, recompute, schedule
  // The bytes one process needs: every rank's peak together under threads, the largest rank's under MPI.
  int64_t per_process() const;
  const RankMemory& largest() const;  // the rank with the largest peak
  std::string table() const;          // one row per rank, sizes in MiB/GiB
  // Per planned rank with `kept`: a micro-batch's frame, its `top` largest tensors and who reads
  // each, and the rest summed.
  std::string kept_table(int top) const;
  nlohmann::json to_json() const;
};

// `c` must have passed TrainConfig::check (batch sizes resolved). `threads`: the ranks run as
// threads of one process. `symmetric`: plan only the first rank of each pipeline rank (every stage
// is compiled once either way; planning each rank's blocks is what grows with the ranks: seconds a
// rank for a large model), for meshes whose other ranks hold blocks of the same shapes (every
// sharded dim dividing evenly, as plan --auto's rules require).
// `list_kept`: also list each rank's kept tensors (RankMemory::kept).
MemoryPlan plan_memory(const TrainConfig& c, bool threads, bool symmetric = false, bool list_kept = false);

// The machine's available memory (/proc/meminfo MemAvailable; physical memory where absent).
int64_t available_memory();
// "1.50 GiB", "12.0 MiB", "3.0 KiB" or "512 B".
std::string human_bytes(int64_t bytes);

}  // namespace shardwise::train
