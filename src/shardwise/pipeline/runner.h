#pragma once
// Runs a schedule's action list on one process: every process of a stage's sub-mesh runs the list
// of that stage's pipeline rank. Each micro-batch in flight on a stage has its own set of buffers
// (a frame; parameters and constants shared); a forward fills it, the backward (or input gradient,
// then weight gradient) empties it, and its parameter gradients are summed over micro-batches in
// the order the schedule computes them. Activations and gradients move between stages as reshard
// plans between the two sub-meshes, fixed before the first step (layouts and shapes are the
// stages' annotations: no per-step handshake); on a device (RunnerOptions::device) through the
// sending or receiving stage's runtime (runtime::Runtime::transfer), on its streams.
//
// Release: with `release`, the runtime frees every forward tensor the gradient kernels do not read
// (OpDef::backward_reads) as soon as the forward no longer needs it, and a stage's output once it
// is sent; without, a micro-batch keeps everything its backward nodes take as operands until its
// backward. Activation bytes are the bytes of the frames in flight, sampled after every action
// (after a compute's own send): exactly what the simulator models.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/pipeline/schedule.h"
#include "shardwise/pipeline/stage.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/runtime/runtime.h"

namespace shardwise::pipeline {

struct RunnerOptions {
  bool release = true;
  bool poison_stand_ins = false;  // tests: a wrongly released tensor shows up as NaN
  int prefetch_params = 0;        // runtime::RuntimeOptions::prefetch_params
  // Where the stages run (the host, or a device: their bound tensors are there). On a device a
  // pipeline rank's stages share one compute and one communication stream (the first local
  // stage's), and activations and gradients move between pipeline ranks as device tensors on them
  // (collectives on device memory: copies between threads' buffers, MPI staged through the host).
  Device device;
  // On a device: run on this runtime's streams instead of new ones (an evaluation runner on the
  // training runner's, so the optimizer's writes on its compute stream come before the reads).
  const runtime::Runtime* streams_of = nullptr;
};

struct ActionTime {
  Action action;
  double start = 0, end = 0;  // seconds since the step began
};

struct StepStats {
  double loss_sum = 0;     // sum of the micro-batches' losses (last stage's processes only)
  // Per StageSpec::stats value of the local stages: its elements (as doubles) summed over the
  // micro-batches.
  std::map<std::string, std::vector<double>> stat_sums;
  std::map<int, double> extra_loss_sums;  // per local stage with a StageSpec::extra_loss: its sum
  double seconds = 0;      // the step on this process
  double compute_seconds = 0;  // in forward/backward actions
  int64_t peak_activation_bytes = 0;
  // The most bytes of buffers held at once in one compute action (runtime::RunStats::peak_bytes:
  // parameters and constants included), forward or backward.
  int64_t peak_bytes = 0;
  // The most bytes of gathered parameter copies held at once in one compute action
  // (runtime::RunStats::peak_gathered_bytes; sharding stage 3).
  int64_t peak_gathered_bytes = 0;
  int64_t prefetched_gathers = 0;  // all-gathers started ahead (RunStats::prefetched), summed over the actions
  std::vector<ActionTime> timeline;
  // Per local stage: the frame's bytes after the first micro-batch's forward and after its input
  // gradient (split schedules): the simulator's StageCosts::activation_bytes / weight_grad_bytes.
  std::map<int, int64_t> forward_bytes, weight_grad_bytes;
};

// The one gradient accumulation (over micro-batches, over a parameter's tied copies): `sum` += `g`
// elementwise in f32, in index order; an undefined `sum` becomes an f32 copy of `g`.
void accumulate_grad(Tensor& sum, const Tensor& g);

class PipelineRunner {
 public:
  // `stage_meshes[s]`: the processes of every stage s (to plan the transfers); `local`: this
  // process's stages (schedule.stages_of(its pipeline rank)), compiled here.
  PipelineRunner(Schedule schedule, std::vector<mesh::ProcessMesh> stage_meshes, std::vector<StageSpec> local,
                 std::shared_ptr<comm::Communicator> world, RunnerOptions options = {});
  ~PipelineRunner();

  const Schedule& schedule() const { return schedule_; }
  int pipeline_rank() const { return rank_; }
  const std::vector<int>& local_stages() const { return stages_; }
  const StageSpec& spec(int stage) const;
  const CompiledStage& compiled(int stage) const;
  // Bind parameters and constants here (set_local / set_global); they are shared by every frame.
  runtime::Runtime& runtime(int stage);
  const runtime::Runtime& runtime(int stage) const;  // its last run's RunStats, its buffers

  // Runs every action but the optimizer step. `feed` binds a micro-batch's inputs (the stage's
  // feeds) before its forward; `on_result` (optional) reads the stage's result after it.
  using Feed = std::function<void(int stage, int micro_batch, runtime::Runtime&)>;
  StepStats run(const Feed& feed, const Feed& on_result = {});

  // The gradients of the stage's parameters (graph params() order, the parameters' layouts),
  // summed over the micro-batches of the last run.
  const std::vector<Tensor>& grads(int stage) const;
  // Lets go of the last run's gradient sums (sharding stage 2 keeps only its reduced shards).
  void release_grads();

  // Gradient hand-over, to overlap their reduction with the backward: during a stage's last
  // backward action of the step (its last micro-batch's backward or weight gradient), right after
  // the instruction that computes parameter i's gradient, the gradient is added into its sum and
  // `ready(stage, i, sum)` is called (the other parameters: at the action's end). The callee may take the sum (grads(stage)[i]
  // is then undefined after the run). Empty: no hand-over.
  using GradReady = std::function<void(int stage, size_t index, Tensor& sum)>;
  void set_grad_ready(GradReady ready) { grad_ready_ = std::move(ready); }

 private:
  struct Local;
  template <class Self>
  static auto& local_of(Self& self, int stage);  // const-preserving lookup of a local stage
  Local& local(int stage);
  void forward(Local& l, int mb, const Feed& feed, const Feed& on_result, StepStats& stats);
  void backward(Local& l, int mb, ActionKind kind, StepStats& stats);
  void accumulate(Local& l);
  void add_to_sum(Local& l, size_t i);  // the backward's gradient i into its sum
  void hand_over(Local& l, size_t i);
  // A send or receive between stages (this process's side), on the local stage `l`'s streams.
  Tensor send_or_receive(Local& l, const reshard::Plan& plan, const Tensor& t);
  int64_t frame_bytes(const Local& l, const std::vector<Tensor>& frame) const;
  int64_t activation_bytes() const;

  Schedule schedule_;
  std::vector<mesh::ProcessMesh> meshes_;
  std::shared_ptr<comm::Communicator> world_, p2p_;
  RunnerOptions options_;
  int rank_ = 0;
  std::vector<int> stages_;
  std::vector<std::unique_ptr<Local>> locals_;
  reshard::Resharder resharder_;
  // Keyed by (stage that consumes it, micro-batch): received or handed over, not yet bound.
  std::map<std::pair<int, int>, Tensor> inbox_act_, inbox_grad_;
  // Keyed by (stage that produced it, micro-batch): computed, not yet sent.
  std::map<std::pair<int, int>, Tensor> outbox_act_, outbox_grad_;
  GradReady grad_ready_;
  size_t action_ = 0;  // the action run() is at
};

}  // namespace shardwise::pipeline
