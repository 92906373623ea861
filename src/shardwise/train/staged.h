#pragma once
// The Trainer's model as pipeline stages: every run, with or without a `pp` dim. Without pp the
// whole GPT is one stage on the whole mesh, run by the trivial schedule (each micro-batch's
// forward, then its backward). With pp the GPT is cut by layer (embeddings on the first stage,
// head and loss on the last, layers balanced; with v virtual stages per pipeline rank, stage s on
// pp coordinate s % pp), each stage on its sub-mesh of the other dims, run by a schedule's actions.
//
// Parameters live on one stage, except the token embedding when the first and last stages sit on
// different pipeline ranks: the first looks tokens up in it and the last's head is tied to it, so
// both hold a copy; after each backward their gradients are summed (each copy then takes the same
// update), and the gradient norm counts it once.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/pipeline/runner.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/data/data.h"
#include "shardwise/models/gpt.h"
#include "shardwise/data/loader.h"
#include "shardwise/train/optimizer.h"
#include "shardwise/train/sharding.h"

namespace shardwise::train {

struct PipelineConfig {
  std::string schedule = "1f1b";  // on a pp mesh: fthenb, 1f1b, interleaved, zbh1
  int virtual_stages = 1;
  bool release = true;            // free what backward does not need after each forward
  bool poison_stand_ins = false;  // tests
  LoaderOptions loader;           // the training step's batches (loader.h)
  // Sharding stage 2 or gradient buckets: parameter gradients left Partial over the data dims (dp,
  // ep) by the graph (the trainer's ShardedOptimizer or GradBuckets reduce each over its data group);
  // false: all-reduced into the parameters' layouts.
  bool partial_dp_grads = false;
  // Sharding stage >= 1: the moments are left undefined here (the ShardedOptimizer allocates its
  // shards), so the whole moments never exist.
  bool sharded_optimizer = false;
  // Sharding stage 3: every graph stores its parameters sharded over their data dims (dp and ep for
  // dense parameters, dp for experts; StageSpec::shard_params_dims):
  // each rank's ParamState is its shard, gathered before each use; no ShardedOptimizer.
  bool shard_params = false;
  int prefetch_params = 0;  // with shard_params: layers whose gathers start ahead (pipeline::RunnerOptions)
  // Where the parameters, the optimizer state, the constants and each micro-batch's inputs live (the
  // host, or a device: TrainConfig::device).
  Device device;
};

// Moves a parameter's state to `device` or the host (counted copies), an f32 parameter still its
// own master.
void move_param_state(ParamState& p, Device device);

// What a runner's stages compute: the training step, the loss only (validation), or predictions.
enum class StageGraph { Training, Loss, Predictions };

// The stages of a run as StagedGpt cuts them, without parameters, data or a communicator (the
// memory plan compiles them): the schedule (the trivial one-rank 1F1B without pp), each stage's
// sub-mesh and layers, and the strategy of one stage's mesh.
struct StageLayout {
  pipeline::Schedule schedule;
  std::vector<mesh::ProcessMesh> meshes;  // per stage
  std::vector<pipeline::LayerRange> layers;
  Strategy stage_strategy;
};
StageLayout stage_layout(const GptConfig& model, const Strategy& strategy, const PipelineConfig& config,
                         int micro_batches);
// The specs of pipeline rank `pipeline_rank`'s stages (not yet compiled): `sequences` per
// micro-batch on the whole dp dim.
std::vector<pipeline::StageSpec> stage_specs(const GptConfig& model, const StageLayout& layout,
                                             const PipelineConfig& config, int64_t sequences, int pipeline_rank,
                                             StageGraph what);

struct EvalResult {
  int64_t problems = 0, exact = 0;  // held-out addition problems, and those answered exactly
  double accuracy() const { return problems ? static_cast<double>(exact) / static_cast<double>(problems) : 0; }
};

// One MoE layer's router statistics over a step's micro-batches (summed), the same on every rank.
struct MoeLayerSums {
  int64_t layer = 0;
  double aux_loss = 0, z_loss = 0, dropped = 0;
  std::vector<double> expert_tokens;  // [experts] the router's assignments, before capacity
};

class StagedGpt {
 public:
  // `model` as the kernels compute it (parameter dtype, dropout); `micro_batches`: the schedule's
  // m (the trainer's accumulation steps); `sequences_per_micro_batch`: one micro-batch's sequences
  // on the whole dp dim (the trainer's micro_batch x dp).
  StagedGpt(const GptConfig& model, const Strategy& strategy, const PipelineConfig& config,
            int64_t sequences_per_micro_batch, int micro_batches, uint64_t seed, const Tensor& causal_mask,
            std::shared_ptr<comm::Communicator> world);
  ~StagedGpt();

  // This rank's parameters (its stages', each once): the trained ones, and the frozen ones (LoRA's
  // base: `param` only, no gradient, no master, no moments).
  std::vector<ParamState>& params() { return params_; }
  std::vector<ParamState>& frozen() { return frozen_; }

  struct Result {
    double loss = 0;            // summed over the micro-batches, on every rank
    double loader_wait_s = 0;   // seconds this rank blocked on the loader (BatchLoader::last_wait_s)
    double loader_read_s = 0;   // of which waiting for its rows to be read (BatchLoader::last_read_wait_s)
    std::vector<Tensor> grads;  // per params(), f32, summed over the micro-batches
    std::vector<MoeLayerSums> moe;  // per MoE layer of the model, in layer order (none without)
  };
  // Runs the schedule on samples [first, first + micro_batches * sequences_per_micro_batch) of `data`,
  // its batches from the loader (each tp group's reader reads, the others receive); `data` must
  // outlive this object (the loader may be reading the next step's samples); null where
  // reads_data() is false.
  Result forward_backward(const Dataset* data, int64_t first);
  // Whether this rank reads batches (a loader's reader that binds ids or labels): the ranks that
  // open the data files; the same for training and validation batches.
  bool reads_data() const { return loader_->reader() && loader_->needs_data(); }
  // The global gradient norm over every rank (the tied embedding counted once). `sharded`: each
  // rank holds its data group's shard of each gradient (the data dims hold disjoint parts, not replicas).
  double grad_norm(const std::vector<Tensor>& grads, bool sharded = false);
  // Per params(): whether its gradient from forward_backward is Partial(sum) over its data group's
  // dims (PipelineConfig::partial_dp_grads); Error if over some of them only.
  std::vector<bool> grads_partial() const;
  // Each parameter's data group on its stages' mesh (sharding.h data_group_dims: dense parameters
  // dp x ep, experts dp): the ranks holding the same block, whose gradient sums over them
  // (collective over each group on first use; groups in order of their dims).
  const DataGroups& data_groups();
  // Lets the runner go of the last step's gradient sums (after a stage-2 reduce-scatter).
  void release_grads() { runner_->release_grads(); }
  // Gradient hand-over (grad_buckets.h): during forward_backward, `ready(p, sum)` gets params()[p]'s
  // sum over the micro-batches (and over its copies on this rank's stages) as soon as the step's
  // last micro-batch computed it, for the parameters `take` marks, except a tied embedding whose
  // other copy sits on another pipeline rank (complete only after the exchange: left in the
  // result). The callee takes the sum: forward_backward's grads[p] is then undefined.
  using GradReady = std::function<void(size_t param, Tensor& sum)>;
  void set_grad_ready(std::vector<bool> take, GradReady ready);
  // Held-out exact matches of the addition task (greedy answers: a causal model answers a problem
  // exactly iff its argmax at every answer position, given the true prefix, is right), on every rank.
  EvalResult evaluate(const AdditionTask& task, int64_t samples);
  // The mean cross-entropy per token over samples [0, count) of `data`, on every rank: the training
  // graph's forward without dropout and without its backward (a forward-only schedule), micro-batches
  // of sequences_per_micro_batch, the last one padded with ignored labels, read as training batches
  // are (each tp group's reader reads, no prefetch; `data` null where reads_data() is false). Reads
  // the parameters only; the training runner, its buffers and the data position are untouched.
  double validation_loss(const Dataset* data, int64_t count);
  // A model fed from the caller (CustomModel::feeds): the loss of the batch it holds now, as a
  // training step would report it (the mean of its micro-batches' losses, the training micro-batches),
  // forward only and without dropout, on every rank; the parameters and the training runner untouched.
  double fed_loss();
  // A Python model's outputs (CustomModel::outputs) on `batch` (each input of the predictions graph
  // by name, [rows, ...] whole), by name, whole: [rows, ...], its micro-batches' rows in order (the
  // last one padded with copies of row 0, cut off after). The forward without dropout on this run's
  // mesh, reading the parameters only. Each rank gets those its stages make (the last stage's on pp).
  std::map<std::string, Tensor> predict(const std::map<std::string, Tensor>& batch);
  // The whole parameter (its fp32 master; a frozen one in f32) on every rank (collective); with
  // `blocks` (per params(), e.g. the gradients of a step) the whole of the parameter's block there.
  Tensor gather_param(const std::string& name, const std::vector<Tensor>* blocks = nullptr);

  const pipeline::Schedule& schedule() const { return runner_->schedule(); }
  const pipeline::PipelineRunner& runner() const { return *runner_; }
  // The stream this rank's training kernels run on (its first local stage's compute stream; the
  // default stream on the host).
  Stream stream() { return runner_->runtime(runner_->local_stages().front()).stream(); }
  // The [S, S] causal mask its graphs read (undefined when none does: fused attention).
  const Tensor& causal_mask() const { return mask_; }
  // This rank's last step: timeline, peak activation bytes, per-stage frame bytes.
  const pipeline::StepStats& last_stats() const { return last_stats_; }

 private:
  std::vector<pipeline::StageSpec> local_specs(const pipeline::Schedule& schedule, StageGraph what);
  // A forward-only runner over `micro_batches` (the causal mask bound).
  std::unique_ptr<pipeline::PipelineRunner> forward_runner(int micro_batches, StageGraph what);
  void init_params(int64_t process);
  // Binds the parameters (bf16 copies are new tensors after each update) before a run.
  void bind(pipeline::PipelineRunner& runner);
  void exchange_tied(std::vector<Tensor>& grads);
  std::vector<MoeLayerSums> moe_sums(const std::map<std::string, std::vector<double>>& sums);
  int root_of_stage(int stage) const;  // the world rank of the stage's first process
  int my_pipeline_rank() const;
  // A loader of `micro_batches` for this rank's role (ids on the first stage or with packing, labels
  // on the last).
  std::unique_ptr<BatchLoader> make_loader(int micro_batches, LoaderOptions options);

  GptConfig model_;
  Strategy strategy_;        // the whole mesh
  Strategy stage_strategy_;  // a stage's mesh (the whole mesh without pp)
  PipelineConfig config_;
  int64_t sequences_ = 0;  // per micro-batch, on the whole dp dim
  int64_t pp_ = 1;         // pipeline ranks (1 without pp)
  uint64_t seed_ = 0;
  Tensor mask_;
  std::shared_ptr<comm::Communicator> world_;
  std::vector<mesh::ProcessMesh> meshes_;  // per stage
  std::vector<pipeline::LayerRange> layers_;
  std::unique_ptr<pipeline::PipelineRunner> runner_, eval_, val_, predict_;
  std::unique_ptr<BatchLoader> loader_;  // the training step's batches
  std::unique_ptr<BatchLoader> val_loader_;  // validation's, for val_'s micro-batches
  std::unique_ptr<reshard::Resharder> tied_;  // the tied embedding's gradient exchange
  std::unique_ptr<DataGroups> groups_;
  std::vector<ParamState> params_, frozen_;
  // Per params_: counted in the norm (false for the last stage's tied copy).
  std::vector<bool> counted_;
  // Per local stage, per graph parameter (params() order of the stage's graph): its index in params_;
  // per frozen one (frozen_params() order): its index in frozen_.
  std::map<int, std::vector<size_t>> stage_params_, stage_frozen_;
  pipeline::StepStats last_stats_;
  // The hand-over (set_grad_ready): per params_, whether handed over, how many local copies are
  // still to come this step, and the sum so far.
  GradReady grad_ready_;
  std::vector<bool> hand_;
  std::vector<int> copies_, remaining_;
  std::vector<Tensor> pending_;
};

}  // namespace shardwise::train
