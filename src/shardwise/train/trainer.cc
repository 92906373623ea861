#include "shardwise/train/trainer.h"

#include "shardwise/core/error.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/pipeline/schedule.h"
#include "shardwise/train/pipelined.h"

namespace shardwise::train {

void TrainConfig::resolve_batch(int64_t dp) {
  int unknown = (micro_batch == 0) + (accumulation == 0) + (global_batch == 0);
  SW_CHECK(micro_batch >= 0 && accumulation >= 0 && global_batch >= 0,
           "batch sizes must not be negative (micro-batch {}, accumulation {}, global batch {})", micro_batch,
           accumulation, global_batch);
  if (unknown == 3) micro_batch = 8, accumulation = 1, unknown = 1;
  if (unknown == 2) {
    if (accumulation == 0) accumulation = 1;
    else micro_batch = 8;
    unknown = (micro_batch == 0) + (accumulation == 0) + (global_batch == 0);
  }
  if (global_batch == 0) global_batch = micro_batch * accumulation * dp;
  if (accumulation == 0) {
    SW_CHECK(global_batch % (micro_batch * dp) == 0,
             "global batch {} is not a multiple of micro-batch {} x dp {}: no whole number of accumulation steps",
             global_batch, micro_batch, dp);
    accumulation = global_batch / (micro_batch * dp);
  }
  if (micro_batch == 0) {
    SW_CHECK(global_batch % (accumulation * dp) == 0,
             "global batch {} does not divide into {} accumulation steps x dp {}", global_batch, accumulation, dp);
    micro_batch = global_batch / (accumulation * dp);
  }
  SW_CHECK(micro_batch * accumulation * dp == global_batch,
           "global batch {} must equal micro-batch {} x accumulation {} x dp {} (= {})", global_batch, micro_batch,
           accumulation, dp, micro_batch * accumulation * dp);
  SW_CHECK(micro_batch >= 1 && accumulation >= 1, "micro-batch and accumulation must be at least 1");
}

void TrainConfig::check(int64_t ranks) {
  Strategy s = Strategy::from_mesh(mesh::parse_mesh(mesh), sequence_parallel);
  SW_CHECK(s.mesh.size() == ranks, "mesh {} has {} ranks but {} ranks run (use --ranks {} or mpirun -np {})",
           s.mesh.to_string(), s.mesh.size(), ranks, s.mesh.size(), s.mesh.size());
  if (model.seq == 0) model.seq = data.empty() ? AdditionTask::max_length(digits) - 1 : 256;
  model.validate();
  SW_CHECK(dropout >= 0 && dropout < 1, "dropout must be in [0, 1), got {}", dropout);
  SW_CHECK(model.heads % s.tp_size() == 0, "{} heads do not divide over tp={} (each tp rank needs whole heads)",
           model.heads, s.tp_size());
  SW_CHECK(steps >= 1, "steps must be at least 1, got {}", steps);
  SW_CHECK(lr > 0 && min_lr >= 0 && min_lr <= lr, "learning rates must satisfy 0 <= min_lr <= lr and lr > 0 (lr {}, min_lr {})",
           lr, min_lr);
  SW_CHECK(warmup >= 0, "warm-up steps must not be negative, got {}", warmup);
  resolve_batch(s.dp_size());
  if (s.pp >= 0) {  // the schedule's and the stages' constraints, with their numbers
    SW_CHECK(!bf16, "--bf16 with a pipeline (pp) is not supported yet: use f32 parameters on pp meshes");
    SW_CHECK(dropout == 0, "--dropout with a pipeline (pp) is not supported yet: the stages do not pass the "
             "micro-batch's sample offset to the masks");
    const int pp = static_cast<int>(s.mesh.dim_size(s.pp));
    pipeline::make_schedule(pipeline::parse_schedule_kind(schedule), pp, static_cast<int>(accumulation), virtual_stages);
    pipeline::split_layers(static_cast<int>(model.layers), pp * virtual_stages, virtual_stages);
  }
  auto data_set = open_dataset(data, digits, model.seq, seed);
  SW_CHECK(data_set->vocab_needed() <= model.vocab, "{} needs a vocabulary of {} tokens, the model has {} (--vocab)",
           data_set->describe(), data_set->vocab_needed(), model.vocab);
}

Trainer::Trainer(TrainConfig config, std::shared_ptr<comm::Communicator> world)
    : c_(std::move(config)), world_(std::move(world)), adamw_(c_.adamw) {
  c_.check(world_->size());
  strategy_ = Strategy::from_mesh(mesh::parse_mesh(c_.mesh), c_.sequence_parallel);
  data_ = open_dataset(c_.data, c_.digits, c_.model.seq, c_.seed);
  schedule_ = {c_.lr, c_.min_lr, c_.warmup, c_.steps};
  mask_ = causal_mask(c_.model.seq);
  if (strategy_.pp >= 0) {
    pp_ = std::make_unique<PipelineParallel>(c_.model, strategy_, c_.sequence_parallel,
                                             PipelineConfig{c_.schedule, c_.virtual_stages, c_.pipeline_release},
                                             c_.micro_batch * strategy_.dp_size(), static_cast<int>(c_.accumulation),
                                             c_.seed, mask_, world_);
    params_ = pp_->params();
    return;
  }
  compile(train_, true, c_.micro_batch * strategy_.dp_size());
  // Parameters: this rank's block of each, from the counter-based generator.
  const graph::Graph& g = train_.model.g;
  auto coords = strategy_.mesh.coords(strategy_.mesh.rank_index_of_process(world_->members()[static_cast<size_t>(world_->rank())]));
  for (graph::ValueId v : g.params()) {
    const graph::Slot& slot = train_.program.slots[static_cast<size_t>(train_.program.value_slot[static_cast<size_t>(v)])];
    mesh::LocalBlock block = mesh::local_block(slot.meta.shape, slot.dist, strategy_.mesh, coords);
    ParamState p;
    p.name = g.value(v).name;
    p.dist = slot.dist;
    p.mesh = strategy_.mesh;
    p.shape = slot.meta.shape;
    p.master = init_param_block(c_.model, p.name, slot.meta.shape, block.offsets(), block.shape, c_.seed);
    p.param = c_.bf16 ? p.master.to(DType::BF16) : p.master;  // f32: the kernels read the master itself
    p.exp_avg = Tensor(DType::F32, block.shape);
    p.exp_avg_sq = Tensor(DType::F32, block.shape);
    p.decay = slot.meta.shape.ndim() >= 2;
    params_.push_back(std::move(p));
  }
  bind_params(*train_.runtime);
}

Trainer::~Trainer() = default;

void Trainer::compile(Compiled& c, bool training, int64_t micro_batch) {
  GptConfig model = c_.model;
  model.param_dtype = c_.bf16 ? DType::BF16 : DType::F32;
  model.dropout = c_.dropout;
  model.dropout_seed = c_.seed;
  c.model = build_gpt(model, strategy_, micro_batch, training);
  if (training) graph::append_backward(c.model.g, c.model.loss);
  c.program = graph::lower(c.model.g, graph::complete(c.model.g, strategy_.mesh));
  c.runtime = std::make_unique<runtime::Runtime>(c.model.g, c.program, world_);
  c.runtime->set_global("causal_mask", mask_);
  if (training) c.runtime->keep("loss");
}

void Trainer::bind_params(runtime::Runtime& rt) {
  for (ParamState& p : params_) rt.set_local(p.name, p.param);
}

StepResult Trainer::step() {
  StepResult r;
  const int64_t dp = strategy_.dp_size(), per_micro = c_.micro_batch * dp;
  std::vector<Tensor> grads;
  double loss = 0;
  if (pp_) {  // every micro-batch through the pipeline: sums like the loop's
    PipelineParallel::Result pr = pp_->forward_backward(*data_, consumed_);
    loss = pr.loss;
    grads = std::move(pr.grads);
  } else {
    bind_params(*train_.runtime);  // bf16 parameters are new tensors after each update
  }
  for (int64_t a = 0; !pp_ && a < c_.accumulation; ++a) {
    Batch b = make_batch(*data_, consumed_ + a * per_micro, per_micro, c_.model.seq);
    runtime::Runtime& rt = *train_.runtime;
    rt.set_sample_offset(consumed_ + a * per_micro);  // dropout masks follow the samples, not the mesh
    rt.set_global("ids", b.ids);
    rt.set_global("labels", b.labels);
    rt.run();
    last_stats_ = rt.stats();
    loss += rt.gather("loss").at(0);
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor g = rt.local_grad(params_[i].name);
      if (g.dtype() != DType::F32) g = g.to(DType::F32);  // bf16 parameters: the update is in f32
      if (a == 0) {
        grads.push_back(c_.bf16 ? g : g.clone());  // a converted bf16 gradient is already a copy
      } else {
        float* acc = grads[i].data<float>();
        const float* add = g.data<float>();
        for (int64_t j = 0; j < g.numel(); ++j) acc[j] += add[j];
      }
    }
  }
  if (c_.accumulation > 1) {
    const float inv = 1.0f / static_cast<float>(c_.accumulation);
    for (Tensor& g : grads) {
      float* p = g.data<float>();
      for (int64_t j = 0; j < g.numel(); ++j) p[j] *= inv;
    }
  }
  r.loss = loss / static_cast<double>(c_.accumulation);
  r.grad_norm = pp_ ? pp_->grad_norm(grads) : global_grad_norm(params_, grads, strategy_.mesh, *world_);
  clip_grad_norm(grads, r.grad_norm, c_.clip);
  r.lr = schedule_.at(step_);
  adamw_.step(params_, grads, r.lr, step_ + 1);
  ++step_;
  consumed_ += c_.global_batch;
  r.step = step_;
  r.tokens = c_.global_batch * c_.model.seq;
  return r;
}

EvalResult Trainer::evaluate() {
  const auto* task = dynamic_cast<const AdditionTask*>(data_.get());
  SW_CHECK(task != nullptr, "evaluation needs the embedded addition task; {} has no held-out answers",
           data_->describe());
  if (pp_) {
    auto [problems, exact] = pp_->evaluate(*task, c_.eval_samples);
    return EvalResult{problems, exact};
  }
  const int64_t dp = strategy_.dp_size(), batch = c_.micro_batch * dp, S = c_.model.seq;
  if (!eval_.runtime) {
    compile(eval_, false, batch);
  }
  bind_params(*eval_.runtime);
  EvalResult out;
  for (int64_t first = 0; first < c_.eval_samples; first += batch) {
    Tensor ids(DType::I64, Shape{batch, S});
    std::vector<AdditionTask::Problem> problems;
    for (int64_t i = 0; i < batch; ++i) {
      problems.push_back(task->held_out(first + i));
      std::copy(problems.back().tokens.begin(), problems.back().tokens.end() - 1, ids.data<int64_t>() + i * S);
    }
    eval_.runtime->set_global("ids", ids);
    eval_.runtime->keep("predictions");
    eval_.runtime->run();
    Tensor pred = eval_.runtime->gather("predictions");
    for (int64_t i = 0; i < batch && first + i < c_.eval_samples; ++i) {
      const auto& p = problems[static_cast<size_t>(i)];
      bool exact = true;
      for (int64_t t = p.answer_begin; t < p.answer_end; ++t) {
        exact = exact && pred.data<int64_t>()[i * S + t] == p.tokens[static_cast<size_t>(t + 1)];
      }
      ++out.problems;
      out.exact += exact ? 1 : 0;
    }
  }
  return out;
}

void Trainer::restore_position(int64_t step, int64_t consumed) {
  SW_CHECK(step >= 0 && consumed >= 0, "a checkpoint's step {} and consumed samples {} must not be negative", step,
           consumed);
  step_ = step;
  consumed_ = consumed;
}

Tensor Trainer::gather_param(const std::string& name) {
  if (pp_) return pp_->gather_param(name);
  for (ParamState& p : params_) {
    if (p.name != name) continue;
    reshard::Plan plan =
        reshard::plan_reshard(p.shape, DType::F32, {p.mesh, p.dist}, {p.mesh, mesh::DistAttr(p.mesh.ndim())});
    return reshard::Resharder(world_).run(plan, p.master);
  }
  fail("no parameter named '{}'", name);
}

}  // namespace shardwise::train
