#pragma once
// The Trainer's pipeline-parallel part, on a mesh with a `pp` dim: the GPT cut into stages by
// layer (embeddings on the first, head and loss on the last, layers balanced; with v virtual
// stages per pipeline rank, stage s on pp coordinate s % pp), each stage on its sub-mesh of the
// other dims (dp, tp combine with pp), run by a schedule's action lists.
//
// Parameters live on one stage, except the token embedding: the first stage looks tokens up in it
// and the last stage's head is tied to it, so both hold a copy; after each step's backward their
// gradients are summed (each copy then takes the same update), and the gradient norm counts it once.
#include <memory>
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"
#include "shardwise/pipeline/runner.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/train/data.h"
#include "shardwise/train/gpt.h"
#include "shardwise/train/optimizer.h"

namespace shardwise::train {

struct PipelineConfig {
  std::string schedule = "1f1b";  // fthenb, 1f1b, interleaved, zbh1
  int virtual_stages = 1;
  bool release = true;            // free what backward does not need after each forward
  bool poison_stand_ins = false;  // tests
};

class PipelineParallel {
 public:
  // `micro_batches`: the schedule's m (the trainer's accumulation steps); `micro_batch`: sequences
  // per micro-batch on the whole dp dim.
  PipelineParallel(const GptConfig& model, const Strategy& strategy, bool sequence_parallel, const PipelineConfig& config,
                   int64_t micro_batch, int micro_batches, uint64_t seed, const Tensor& causal_mask,
                   std::shared_ptr<comm::Communicator> world);
  ~PipelineParallel();

  // This rank's parameters (its stages', each once), bound to the stages' runtimes.
  std::vector<ParamState>& params() { return params_; }

  struct Result {
    double loss = 0;            // summed over the micro-batches, on every rank
    std::vector<Tensor> grads;  // per params(), summed over the micro-batches
  };
  // Runs the schedule on samples [first, first + micro_batches * micro_batch) of `data`.
  Result forward_backward(const Dataset& data, int64_t first);
  // The global gradient norm over every rank (the tied embedding counted once).
  double grad_norm(const std::vector<Tensor>& grads);
  // Held-out exact matches of the addition task (greedy answers): {problems, exact}, on every rank.
  std::pair<int64_t, int64_t> evaluate(const AdditionTask& task, int64_t samples);
  // The whole parameter on every rank (collective).
  Tensor gather_param(const std::string& name);

  const pipeline::Schedule& schedule() const { return runner_->schedule(); }
  // This rank's last step: timeline, peak activation bytes, per-stage frame bytes.
  const pipeline::StepStats& last_stats() const { return last_stats_; }
  const pipeline::PipelineRunner& runner() const { return *runner_; }
  int64_t pp_size() const { return pp_; }

 private:
  std::vector<pipeline::StageSpec> stage_specs(bool training, int64_t micro_batch);
  void bind(pipeline::PipelineRunner& runner);
  int root_of_stage(int stage) const;  // the world rank of the stage's first process
  int my_pipeline_rank() const;

  GptConfig model_;
  Strategy strategy_;  // the whole mesh (with pp)
  Strategy stage_strategy_;  // a stage's sub-mesh
  PipelineConfig config_;
  int64_t micro_batch_ = 0, pp_ = 1;
  int micro_batches_ = 1;
  uint64_t seed_ = 0;
  Tensor mask_;
  std::shared_ptr<comm::Communicator> world_;
  std::vector<mesh::ProcessMesh> meshes_;  // per stage
  std::vector<pipeline::LayerRange> layers_;
  std::unique_ptr<pipeline::PipelineRunner> runner_, eval_;
  std::unique_ptr<reshard::Resharder> tied_;  // the tied embedding's gradient exchange
  std::vector<ParamState> params_;
  std::vector<bool> counted_;
  pipeline::StepStats last_stats_;  // per params_: counted in the norm (false for the last stage's tied copy)
};

}  // namespace shardwise::train
