#pragma once
// The GPT trainer of one rank. Every rank of the mesh constructs one with the same configuration
// and calls step() / evaluate() together (threads of one process or MPI processes). One driver for
// every mesh: the model runs as pipeline stages (StagedGpt: one stage without pp).
// Its configuration, TrainConfig, is in train_config.h.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/comm/communicator.h"
#include "shardwise/data/data.h"
#include "shardwise/models/gpt.h"
#include "shardwise/models/model_io.h"
#include "shardwise/train/optimizer.h"
#include "shardwise/train/grad_buckets.h"
#include "shardwise/train/sharding.h"
#include "shardwise/train/staged.h"
#include "shardwise/train/train_config.h"

namespace shardwise::train {

// The model as the run's kernels compute it (parameter dtype, dropout, its seed, packing), and its
// stages' configuration: what the Trainer builds its StagedGpt from (and the memory plan compiles).
GptConfig kernel_model(const TrainConfig& c);
PipelineConfig pipeline_config(const TrainConfig& c);

// The run's data: the training samples (with --val-fraction, the corpus before the cut), and the
// validation set (nullptr without --val-data / --val-fraction). Errors name the option.
std::unique_ptr<Dataset> open_training_data(const TrainConfig& c);
std::unique_ptr<EvenWindows> open_validation_data(const TrainConfig& c);
// Error unless the model's vocabulary holds the data's (and the validation set's) tokens.
void check_vocabulary(const TrainConfig& c, const Dataset& data, const EvenWindows* val);
// What the run reads, for its checkpoints (a resume on other data is refused): the file's size and
// the xxh64 of its first and last MiB (its path only for the message), or the embedded task's
// digits and sequence length; several files (a list or a glob): the sorted names and sizes; with
// the held-out fraction and the tokenizer's fingerprint when given. Opens the data files.
nlohmann::json data_fingerprint(const TrainConfig& c);

struct ValidationResult {
  double loss = 0;         // mean cross-entropy per token over the validation sequences
  int64_t sequences = 0;   // how many
  double perplexity() const { return std::exp(loss); }
};

// One MoE layer's router over a step's global batch (every micro-batch): tokens per expert (the
// router's assignments before capacity, summed over every rank's tokens, so no mesh changes them;
// the mean is the batch's tokens x top_k / experts), the assignments capacity dropped, and the
// unscaled aux and z losses (the mean over the micro-batches).
struct MoeStepStats {
  int64_t layer = 0;
  double tokens_min = 0, tokens_mean = 0, tokens_max = 0;
  int64_t dropped = 0;
  double aux_loss = 0, z_loss = 0;
};

struct StepResult {
  int64_t step = 0;  // completed optimizer steps
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;  // tokens in this step's global batch
  bool skipped = false;  // non-finite loss or gradient norm, skipped (TrainConfig::skip_nonfinite)
  // The longest any rank blocked on the loader this step (the read not done, the broadcast: a
  // non-reader also waits there for its reader to arrive), and the longest a reader waited for its
  // rows to be read (what prefetch hides).
  double loader_wait_s = 0, loader_read_s = 0;
  std::vector<MoeStepStats> moe;  // per MoE layer (Llama with --experts), in layer order
};

// The model's parameters, each counted once whatever the mesh, and the optimizer state of every
// rank together.
struct ParameterCounts {
  int64_t trained = 0, frozen = 0;
  int64_t optimizer_bytes = 0;  // summed over the ranks (data-parallel replicas hold copies)
};

// What one rank holds, piece by piece as the memory plan (memory_plan.h) names the pieces.
struct HeldBytes {
  int64_t params = 0;       // its blocks of every parameter, frozen ones too
  int64_t grads = 0;        // its gradient buffers at the last step's update (let go after it)
  int64_t optimizer = 0;    // Trainer::optimizer_state_bytes
  int64_t activations = 0;  // the last step's peak of saved activations
  int64_t gathered = 0;     // the last step's peak of all-gathered parameter copies (stage 3)
};

class Trainer {
 public:
  Trainer(TrainConfig config, std::shared_ptr<comm::Communicator> world);
  ~Trainer();

  StepResult step();
  // Exact-match accuracy on held-out addition problems (greedy answers: a causal model answers a
  // problem exactly iff its argmax at every answer position, given the true prefix, is right).
  // Error for datasets other than the addition task.
  EvalResult evaluate();
  // The mean next-token cross-entropy over the validation set (TrainConfig::val_*), forward only:
  // no dropout, no gradient, no change to the parameters, the data position or any generator, so
  // the training losses are the same with or without it. Error without a validation set. A model
  // fed from the caller (CustomModel::feeds) instead gives the loss of the batch it was handed, as
  // a step would report it (StagedGpt::fed_loss), its count the global batch's rows.
  ValidationResult validate();
  // A Python model's outputs on `batch` (StagedGpt::predict): forward only, as validate().
  std::map<std::string, Tensor> predict(const std::map<std::string, Tensor>& batch) { return model_->predict(batch); }
  bool has_validation() const { return c_.data.has_validation(); }

  // The data files are opened only on the ranks that read batches (StagedGpt::reads_data; every
  // rank holds the embedded addition task): they check the data and compute its fingerprint, and
  // every rank learns the results (collective, in the constructor). A non-reader never opens a file.
  // The training samples and the validation set where read (Error / nullptr elsewhere).
  const Dataset& dataset() const;
  const EvenWindows* validation_data() const { return val_.get(); }
  // On every rank: the data's and the validation set's descriptions ("" without one), and
  // data_fingerprint(config()).
  const std::string& data_description() const { return data_description_; }
  const std::string& validation_description() const { return validation_description_; }
  const nlohmann::json& data_fingerprint() const { return data_fingerprint_; }

  const TrainConfig& config() const { return c_; }
  const Strategy& strategy() const { return strategy_; }
  int64_t steps_done() const { return step_; }
  int64_t consumed_samples() const { return consumed_; }
  int64_t skipped_steps() const { return skipped_; }
  // AdamW's own step count (its bias correction's t after the next step is this + 1): steps_done(),
  // less the steps before its moments last started fresh (a --skip-optimizer resume).
  int64_t optimizer_steps() const { return step_ - optimizer_from_; }
  // The trained parameters (with LoRA: the adapters only) and the frozen ones (LoRA's base).
  std::vector<ParamState>& params() { return model_->params(); }
  std::vector<ParamState>& frozen() { return model_->frozen(); }
  // The whole parameter (its fp32 master; collective: every rank calls it), for tests and exports.
  Tensor gather_param(const std::string& name) { return gather_state(name, &ParamState::master); }
  // The whole of one part of a trained parameter's state: &ParamState::master, exp_avg or
  // exp_avg_sq, however the optimizer shards it (collective).
  Tensor gather_state(const std::string& name, Tensor ParamState::*field);
  // The whole gradient of a trained parameter in the last step (averaged over the micro-batches,
  // clipped as the update used it); collective. Needs keep_gradients(true) before that step: by
  // default a step lets go of its gradients after the update, so that the next forward reuses
  // their bytes (the memory plan counts them from the first backward to the update only).
  Tensor gather_grad(const std::string& name);
  void keep_gradients(bool keep) { keep_grads_ = keep; }
  // Bytes of optimizer state this rank holds: the AdamW moments (and fp32 masters of bf16
  // parameters) of its blocks of the trained parameters, or of its shards of them under sharding;
  // nothing for frozen ones.
  int64_t optimizer_state_bytes() const;
  // This rank's bytes per piece after a step (what bench_sharding_memory and the memory plan's
  // tests measure against the plan).
  HeldBytes held_bytes() const;
  // The sharded optimizer (nullptr unless sharding stage 1 or 2). Checkpoints save and load each
  // rank's ranges of params() through its plan (train/checkpointing.cc).
  const ShardedOptimizer* sharded() const { return sharded_.get(); }
  ShardedOptimizer* sharded() { return sharded_.get(); }
  // The gradient buckets (nullptr with --overlap-grad-reduce off or data groups of one).
  const GradBuckets* grad_buckets() const { return buckets_.get(); }
  ParameterCounts count_parameters();  // collective
  // The model directory the weights came from (init_from_model) and its fingerprint
  // (model_fingerprint); empty for the seeded initialization. A LoRA run's checkpoints keep it.
  struct BaseModel {
    std::string dir, fingerprint;
  };
  const BaseModel& base_model() const { return base_model_; }
  // The stream this rank's kernels and updates run on (on the host: the default stream). Host code
  // that reads or writes the trainer's device tensors between steps (checkpoints) does so on it.
  Stream compute_stream() { return model_->stream(); }
  void set_base_model(BaseModel base) { base_model_ = std::move(base); }
  // The options the run was given ({"name": ["value", ...]}), which its checkpoints keep in
  // run_options.json (run_options.h); null: none written.
  const nlohmann::json& run_options() const { return run_options_; }
  void set_run_options(nlohmann::json options) { run_options_ = std::move(options); }
  const LrSchedule& schedule() const { return schedule_; }
  // Continues from a checkpoint: `step` optimizer steps done, `consumed` samples used, and
  // `optimizer_steps` of them taken by the moments the trainer now holds (-1: all `step`; 0: fresh
  // moments, whose bias correction starts again at t = 1 as a new torch optimizer's does).
  void restore_position(int64_t step, int64_t consumed, int64_t optimizer_steps = -1);
  // A device run's parameter state (trained and frozen) to `device`, or to the host and back:
  // checkpoint loads write it with host code (counted copies; nothing on a host run).
  void move_state(Device device);
  // The stages this rank runs (one without pp): schedule, last step's timeline and activations.
  const StagedGpt& stages() const { return *model_; }

 private:
  void open_data();  // collective: see dataset()

  TrainConfig c_;
  std::shared_ptr<comm::Communicator> world_;
  Strategy strategy_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<EvenWindows> val_;
  std::string data_description_, validation_description_;
  int64_t val_size_ = 0;
  nlohmann::json data_fingerprint_;
  DataRankScope data_rank_;  // the test hook's rank for this thread (data.h)
  std::unique_ptr<StagedGpt> model_;
  AdamW adamw_;
  LrSchedule schedule_;
  int64_t step_ = 0, consumed_ = 0, skipped_ = 0, optimizer_from_ = 0;
  bool keep_grads_ = false;
  std::vector<Tensor> last_grads_;  // with keep_grads_: the last step's gradients (the runner's sums, not copies; shards when sharded)
  int64_t last_grad_bytes_ = 0;     // the runner's gradient sums at the last step's update (HeldBytes::grads)
  std::unique_ptr<ShardedOptimizer> sharded_;
  std::vector<bool> partial_grads_;  // per params(): Partial over its data group (stage 2, or buckets)
  std::unique_ptr<GradBuckets> buckets_;  // --overlap-grad-reduce on|after, a data group of more than one
  // The step's gradients after the dp reduction (the accumulation mean taken): whole blocks, or
  // this rank's ranges when sharded.
  std::vector<Tensor> reduce_grads(std::vector<Tensor>& grads);
  BaseModel base_model_;
  nlohmann::json run_options_;
};

}  // namespace shardwise::train
