#include "shardwise/train/staged.h"

#include <cstring>

#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/pipeline/validate.h"
#include "shardwise/reshard/executor.h"
#include "shardwise/models/custom.h"
#include "shardwise/models/llama.h"
#include "shardwise/models/models.h"
#include "shardwise/data/packing.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/train/context_parallel.h"

namespace shardwise::train {
namespace {

int64_t my_process(const comm::Communicator& world) { return world.members()[static_cast<size_t>(world.rank())]; }

int world_index(const comm::Communicator& world, int64_t process) {
  const auto& m = world.members();
  auto it = std::find(m.begin(), m.end(), static_cast<int>(process));
  SW_CHECK(it != m.end(), "process {} is not in the communicator", process);
  return static_cast<int>(it - m.begin());
}

// Without pp: one stage, each micro-batch's forward then its backward (1F1B on one rank).
pipeline::Schedule training_schedule(const Strategy& s, const PipelineConfig& c, int micro_batches) {
  if (s.pp < 0) return pipeline::one_f_one_b(1, micro_batches);
  return pipeline::make_schedule(pipeline::parse_schedule_kind(c.schedule), static_cast<int>(s.mesh.dim_size(s.pp)),
                                 micro_batches, c.virtual_stages);
}

// The graph's constant inputs (the causal mask, unless packed documents bring theirs with each
// micro-batch; Llama's positions) on every local stage.
// On a device, each rank's block of them is copied there once.
void bind_constants(pipeline::PipelineRunner& runner, const GptConfig& model, const Tensor& mask, Device device) {
  std::map<std::string, Tensor> constants = model_constants(model);
  if (constants.contains("causal_mask")) constants["causal_mask"] = mask;
  for (int s : runner.local_stages()) {
    const std::vector<std::string>& here = runner.spec(s).constants;
    runtime::Runtime& rt = runner.runtime(s);
    for (const auto& [name, value] : constants) {
      if (std::find(here.begin(), here.end(), name) == here.end()) continue;
      if (device.is_host()) {
        rt.set_global(name, value);
      } else {
        const mesh::LocalBlock b = rt.local_block(name);
        rt.set_local(name, to_device(value.slice(b.offsets(), b.shape), device, rt.stream()));
      }
    }
  }
}

// Binds this rank's block of `name` from `rows`, the rows [row0, row0 + rows) of the micro-batch
// (the same block set_global would cut from the whole micro-batch).
// On a device, the block is copied there (one counted copy).
void bind_block(runtime::Runtime& rt, std::string_view name, const Tensor& rows, int64_t row0,
                Device device = Device::host()) {
  mesh::LocalBlock b = rt.local_block(name);
  std::vector<int64_t> offsets(b.offsets().begin(), b.offsets().end());
  offsets[0] -= row0;
  SW_CHECK(offsets[0] >= 0 && offsets[0] + b.shape[0] <= rows.shape()[0],
           "loader: '{}' needs rows [{}, {}) of the micro-batch on this rank, but its data-parallel block holds [{}, "
           "{}): the input is not sharded S(0) over dp",
           name, b.offset[0], b.offset[0] + b.shape[0], row0, row0 + rows.shape()[0]);
  const Tensor block = rows.slice(offsets, b.shape);
  rt.set_local(name, device.is_host() ? block : to_device(block, device, rt.stream()));
}

// Binds this rank's rows of a micro-batch: ids on the first stage, labels on the last, and with
// packed documents the attention mask on every stage and the position ids on the first (GPT-2's
// position embedding) or on every stage (Llama's rotary embedding in every layer). With cp, each
// [rows, S] input in cp's order (context_parallel.h), whose S(1) block over cp bind_block cuts.
void bind_rows(runtime::Runtime& rt, const GptConfig& model, bool first, bool last, const RowBatch& b, Device device) {
  const int64_t cp = model.cp_order;
  if (first) bind_block(rt, "ids", to_cp_order(b.ids, cp), b.row0, device);
  if (last) bind_block(rt, "labels", to_cp_order(b.labels, cp), b.row0, device);
  if (!model.document_mask) return;
  DocumentInputs d = document_inputs(b.ids, model.eos_id, !model.fused_attention());  // row by row: the rows' own
  if (model.fused_attention()) {
    bind_block(rt, "document_ids", to_cp_order(d.document_ids, cp), b.row0, device);
  } else {
    bind_block(rt, "attention_mask", d.attention_mask, b.row0, device);
  }
  if (first || model.is_llama()) bind_block(rt, "position_ids", to_cp_order(d.position_ids, cp), b.row0, device);
}

// A model fed from the caller (CustomModel::feeds): this rank's rows of micro-batch `mb` of each
// feed the stage's graph takes, cut from the step's whole batch.
void bind_fed(runtime::Runtime& rt, const CustomModel& custom, const pipeline::StageSpec& spec, int64_t row0,
              int64_t rows, Device device) {
  for (const std::string& name : custom.feeds) {
    if (std::find(spec.feeds.begin(), spec.feeds.end(), name) == spec.feeds.end()) continue;
    const Tensor whole = custom.batch(name);
    SW_CHECK(whole.shape().ndim() >= 1 && whole.shape()[0] >= row0 + rows,
             "the batch's '{}' has shape [{}]; micro-batch rows [{}, {}) are missing", name, whole.shape().to_string(),
             row0, row0 + rows);
    bind_block(rt, name, whole, -row0, device);  // the whole batch's rows: micro-batch row r is row row0 + r
  }
}

// A custom model's MoE layers (none when it lists none, or `when` is false).
std::vector<CustomMoe> custom_moe_layers(const GptConfig& model, bool when) {
  if (!when || !model.custom || !model.custom->moe_layers) return {};
  return model.custom->moe_layers();
}

}  // namespace

void move_param_state(ParamState& p, Device device) {
  const bool own_master = has_own_master(p);
  auto move = [&](Tensor& t) {
    if (!t.defined() || t.device() == device) return;
    t = device.is_host() ? to_host(t, current_stream()) : to_device(t, device, current_stream());
  };
  move(p.master);
  move(p.exp_avg);
  move(p.exp_avg_sq);
  if (p.master.defined() && !own_master) p.param = p.master;  // f32: the kernels read the master itself
  else move(p.param);
}

StagedGpt::StagedGpt(const GptConfig& model, const Strategy& strategy, const PipelineConfig& config,
                     int64_t sequences_per_micro_batch, int micro_batches, uint64_t seed, const Tensor& causal_mask,
                     std::shared_ptr<comm::Communicator> world)
    : model_(model),
      strategy_(strategy),
      config_(config),
      sequences_(sequences_per_micro_batch),
      seed_(seed),
      mask_(causal_mask),
      world_(std::move(world)) {
  pp_ = strategy_.pp < 0 ? 1 : strategy_.mesh.dim_size(strategy_.pp);
  StageLayout layout = stage_layout(model_, strategy_, config_, micro_batches);
  pipeline::Schedule schedule = std::move(layout.schedule);
  layers_ = std::move(layout.layers);
  meshes_ = std::move(layout.meshes);
  stage_strategy_ = layout.stage_strategy;
  std::vector<pipeline::StageSpec> specs = local_specs(schedule, StageGraph::Training);
  // Release on every mesh: even when each backward follows its forward at once, a forward tensor
  // the gradients read the shape of only (and, with recompute, a segment's values) need not wait.
  pipeline::RunnerOptions ro{config_.release, config_.poison_stand_ins, config_.prefetch_params, config_.device};
  runner_ = std::make_unique<pipeline::PipelineRunner>(std::move(schedule), meshes_, std::move(specs), world_, ro);
  {
    StreamScope on_compute(stream());  // a device run's state lives (and is freed) on its compute stream
    init_params(my_process(*world_));
  }
  bind_constants(*runner_, model_, mask_, config_.device);
  loader_ = make_loader(micro_batches, config_.loader);
}

std::unique_ptr<BatchLoader> StagedGpt::make_loader(int micro_batches, LoaderOptions options) {
  const pipeline::Schedule& sch = runner_->schedule();
  const int S = sch.stages();
  const bool first_here = sch.rank_of(0) == my_pipeline_rank(), last_here = sch.rank_of(S - 1) == my_pipeline_rank();
  const bool reads = !fed_batches(model_);
  return std::make_unique<BatchLoader>(strategy_, my_process(*world_), world_, sequences_, micro_batches, model_.seq,
                                       (first_here || model_.document_mask) && reads, last_here && reads, options);
}

StagedGpt::~StagedGpt() = default;

StageLayout stage_layout(const GptConfig& model, const Strategy& strategy, const PipelineConfig& config,
                         int micro_batches) {
  StageLayout out;
  out.schedule = training_schedule(strategy, config, micro_batches);
  pipeline::validate(out.schedule);
  const int S = out.schedule.stages();
  const int64_t pp = strategy.pp < 0 ? 1 : strategy.mesh.dim_size(strategy.pp);
  out.layers = pipeline::split_layers(static_cast<int>(model.layers), S, out.schedule.virtual_stages);
  for (int s = 0; s < S; ++s)
    out.meshes.push_back(strategy.pp < 0 ? strategy.mesh : pipeline::stage_mesh(strategy.mesh, strategy.pp, s % pp, "dp"));
  out.stage_strategy = Strategy::from_mesh(out.meshes[0], strategy.sequence_parallel);
  return out;
}

std::vector<pipeline::StageSpec> stage_specs(const GptConfig& model_in, const StageLayout& layout,
                                             const PipelineConfig& config, int64_t sequences, int pipeline_rank,
                                             StageGraph what) {
  std::vector<pipeline::StageSpec> out;
  const int S = layout.schedule.stages();
  const Strategy& stage_strategy = layout.stage_strategy;
  // The loss graph is the training graph without dropout, read at its summed cross-entropy, and
  // compiled without a backward (StageSpec::training false).
  GptConfig model = model_in;
  if (what == StageGraph::Loss) model.dropout = 0, model.head_grads_in_forward = false;
  const bool with_loss = what != StageGraph::Predictions;
  for (int s : layout.schedule.stages_of(pipeline_rank)) {
    const pipeline::LayerRange& range = layout.layers[static_cast<size_t>(s)];
    GptGraph gpt = build_model(model, stage_strategy, sequences, with_loss, GptPart{range.begin, range.end, s == 0, s == S - 1});
    pipeline::StageSpec spec;
    spec.stage = s;
    spec.training = what == StageGraph::Training;
    if (spec.training && config.partial_dp_grads) {  // each gradient reduced over its data group after
      for (int d : stage_strategy.data_dims()) spec.partial_grad_dims.push_back(layout.meshes[0].dim_names()[static_cast<size_t>(d)]);
    }
    for (int d : stage_strategy.data_dims()) {  // every graph: shared blocks; dense over dp x ep, experts over dp
      if (config.shard_params && layout.meshes[0].dim_size(d) > 1)
        spec.shard_params_dims.push_back(layout.meshes[0].dim_names()[static_cast<size_t>(d)]);
    }
    spec.graph = std::make_shared<graph::Graph>(std::move(gpt.g));
    const graph::Graph& g = *spec.graph;
    if (gpt.input >= 0) spec.input = g.value(gpt.input).name;
    if (gpt.output >= 0) spec.output = g.value(gpt.output).name, spec.output_grad = g.value(gpt.output_grad).name;
    if (gpt.loss >= 0) spec.loss = g.value(what == StageGraph::Loss ? gpt.loss_sum : gpt.loss).name;
    if (gpt.predictions >= 0) spec.results.push_back(g.value(gpt.predictions).name);
    if (what == StageGraph::Predictions && model_in.custom && model_in.custom->outputs) {  // nn.output's, made here
      for (const std::string& name : model_in.custom->outputs())
        if (g.find(name)) spec.results.push_back(name);
    }
    if (spec.training && gpt.extra_loss >= 0) spec.extra_loss = g.value(gpt.extra_loss).name;
    for (int64_t l = range.begin; l < range.end && spec.training; ++l) {
      if (!model.is_moe_layer(l)) continue;
      for (const std::string& name : moe_stat_names(l)) spec.stats.push_back(name);
    }
    for (const CustomMoe& moe : custom_moe_layers(model, spec.training)) {
      if (!g.find(moe.op)) continue;  // another stage's
      for (const std::string& name : moe_op_stat_names(moe.op)) spec.stats.push_back(name);
    }
    if (fed_batches(model_in)) {
      for (const std::string& name : model_in.custom->feeds)
        if (g.find(name)) spec.feeds.push_back(name);
    } else {
      if (s == 0) spec.feeds.push_back("ids");
      if (s == S - 1 && (with_loss || (model_in.custom && g.find("labels")))) spec.feeds.push_back("labels");
    }
    for (const std::string& name : model_constant_names(model_in))  // GPT-2's cp positions: the first stage's only
      if (g.find(name)) spec.constants.push_back(name);
    if (model_in.document_mask) {  // per micro-batch (bind_rows)
      spec.feeds.push_back(model_in.fused_attention() ? "document_ids" : "attention_mask");
      if (s == 0 || model_in.is_llama()) spec.feeds.push_back("position_ids");
    }
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<pipeline::StageSpec> StagedGpt::local_specs(const pipeline::Schedule& schedule, StageGraph what) {
  StageLayout layout{schedule, meshes_, layers_, stage_strategy_};
  return stage_specs(model_, layout, config_, sequences_, my_pipeline_rank(), what);
}

// This process's block of each parameter of its stages, from the counter-based generator (so any
// mesh holds the single-device numbers); frozen ones hold the kernels' copy only.
void StagedGpt::init_params(int64_t process) {
  const bool first_here = runner_->schedule().rank_of(0) == runner_->pipeline_rank();
  for (int s : runner_->local_stages()) {
    const graph::Graph& g = *runner_->spec(s).graph;
    const graph::Program& p = runner_->compiled(s).program;
    const mesh::ProcessMesh& m = meshes_[static_cast<size_t>(s)];
    auto coords = m.coords(m.rank_index_of_process(process));
    for (bool trained : {true, false}) {
      std::vector<ParamState>& states = trained ? params_ : frozen_;
      std::vector<size_t>& index = (trained ? stage_params_ : stage_frozen_)[s];
      for (graph::ValueId v : trained ? g.params() : g.frozen_params()) {
        const graph::Slot& slot = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])];
        const std::string& name = g.value(v).name;
        auto same = std::find_if(states.begin(), states.end(), [&](const ParamState& q) { return q.name == name; });
        index.push_back(static_cast<size_t>(same - states.begin()));
        if (same != states.end()) {  // the tied embedding on a second local stage
          SW_CHECK(same->dist == slot.dist, "pipeline: '{}' is laid out [{}] on one stage and [{}] on another", name,
                   same->dist.to_string(), slot.dist.to_string());
          continue;
        }
        mesh::LocalBlock block = mesh::local_block(slot.meta.shape, slot.dist, m, coords);
        ParamState q;
        q.name = name;
        q.dist = slot.dist;
        q.mesh = m;
        q.shape = slot.meta.shape;
        Tensor initial = init_model_param_block(model_, name, slot.meta.shape, block.offsets(), block.shape, seed_);
        // f32: the kernels read the master itself.
        q.param = model_.param_dtype == DType::BF16 ? initial.to(DType::BF16) : initial;
        if (trained) {
          q.master = initial;
          if (!config_.sharded_optimizer) {
            q.exp_avg = Tensor(DType::F32, block.shape);
            q.exp_avg_sq = Tensor(DType::F32, block.shape);
          }
          q.decay = slot.meta.shape.ndim() >= 2;
          counted_.push_back(name != tied_embedding(model_) || first_here);
        }
        if (!config_.device.is_host()) move_param_state(q, config_.device);
        states.push_back(std::move(q));
      }
    }
  }
}

void StagedGpt::bind(pipeline::PipelineRunner& runner) {
  for (int s : runner.local_stages()) {
    runtime::Runtime& rt = runner.runtime(s);
    for (size_t k : stage_params_.at(s)) rt.set_local(params_[k].name, params_[k].param);
    for (size_t k : stage_frozen_.at(s)) rt.set_local(frozen_[k].name, frozen_[k].param);
  }
}

int StagedGpt::my_pipeline_rank() const {
  if (strategy_.pp < 0) return 0;
  auto coords = strategy_.mesh.coords(strategy_.mesh.rank_index_of_process(my_process(*world_)));
  return static_cast<int>(coords[static_cast<size_t>(strategy_.pp)]);
}

int StagedGpt::root_of_stage(int stage) const {
  return world_index(*world_, meshes_[static_cast<size_t>(stage)].process_ids()[0]);
}

StagedGpt::Result StagedGpt::forward_backward(const Dataset* data, int64_t first) {
  const int S = runner_->schedule().stages();
  std::vector<RowBatch> batches = loader_->take(data, first);  // before the step's collectives
  auto feed = [&](int stage, int mb, runtime::Runtime& rt) {
    rt.set_sample_offset(first + mb * sequences_);  // dropout masks follow the samples, not the mesh
    if (fed_batches(model_)) {
      return bind_fed(rt, *model_.custom, runner_->spec(stage), mb * sequences_, sequences_, config_.device);
    }
    if (stage != 0 && stage != S - 1 && !model_.document_mask) return;
    bind_rows(rt, model_, stage == 0, stage == S - 1, batches[static_cast<size_t>(mb)], config_.device);
  };
  bind(*runner_);
  remaining_ = copies_;
  pending_.assign(params_.size(), Tensor());
  last_stats_ = runner_->run(feed);
  Result r;
  r.loss = last_stats_.loss_sum;
  r.loader_wait_s = loader_->last_wait_s();
  r.loader_read_s = loader_->last_read_wait_s();
  world_->broadcast(&r.loss, 1, DType::F64, root_of_stage(S - 1));
  if (strategy_.pp >= 0 && ((model_.is_llama() && model_.experts > 0) || model_.custom)) {
    // The earlier stages' router losses (a custom model's extra loss terms): each counted once, by
    // its stage's first process.
    double extra = 0;
    for (const auto& [s, sum] : last_stats_.extra_loss_sums) extra += root_of_stage(s) == world_->rank() ? sum : 0.0;
    world_->all_reduce(&extra, &extra, 1, DType::F64, comm::Reduce::Sum);
    r.loss += extra;
  }
  r.moe = moe_sums(last_stats_.stat_sums);
  r.grads.resize(params_.size());
  for (int s : runner_->local_stages()) {
    const std::vector<Tensor>& grads = runner_->grads(s);
    const std::vector<size_t>& index = stage_params_.at(s);
    for (size_t i = 0; i < index.size(); ++i) {
      if (grad_ready_ && hand_[index[i]]) continue;  // handed over (the callee holds it)
      Tensor& sum = r.grads[index[i]];
      if (!sum.defined()) sum = grads[i];  // the runner's own sum, not copied
      else pipeline::accumulate_grad(sum, grads[i]);  // a tied copy on another local stage
    }
  }
  exchange_tied(r.grads);
  return r;
}

// Every MoE layer's sums from the stages that hold it: the ranks of a stage hold the same (R)
// values, the others zeros, and every figure is >= 0, so one all-reduce (max) gives them to all.
std::vector<MoeLayerSums> StagedGpt::moe_sums(const std::map<std::string, std::vector<double>>& sums) {
  // Each MoE layer: its index, experts and statistics' names (a custom model's from its moe_mlp nodes).
  std::vector<std::tuple<int64_t, size_t, std::array<std::string, 4>>> layers;
  if (model_.custom) {
    for (const CustomMoe& m : custom_moe_layers(model_, true))
      layers.emplace_back(m.layer, static_cast<size_t>(m.experts), moe_op_stat_names(m.op));
  } else if (model_.is_llama() && model_.experts > 0) {
    for (int64_t l = 0; l < model_.layers; ++l)
      if (model_.is_moe_layer(l)) layers.emplace_back(l, static_cast<size_t>(model_.experts), moe_stat_names(l));
  }
  std::vector<MoeLayerSums> out;
  std::vector<double> flat;
  for (const auto& [l, E, names] : layers) {
    out.push_back(MoeLayerSums{l, 0, 0, 0, {}});
    for (size_t i = 0; i < names.size(); ++i) {
      auto it = sums.find(names[i]);
      const size_t n = i < 3 ? 1 : E;
      SW_CHECK(it == sums.end() || it->second.size() == n, "pipeline: statistic '{}' has {} elements, not {}",
               names[i], it->second.size(), n);
      if (it == sums.end()) flat.insert(flat.end(), n, 0.0);
      else flat.insert(flat.end(), it->second.begin(), it->second.end());
    }
  }
  if (out.empty()) return out;
  world_->all_reduce(flat.data(), flat.data(), static_cast<int64_t>(flat.size()), DType::F64, comm::Reduce::Max);
  const double* f = flat.data();
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t E = std::get<1>(layers[k]);
    out[k].aux_loss = f[0], out[k].z_loss = f[1], out[k].dropped = f[2];
    out[k].expert_tokens.assign(f + 3, f + 3 + E);
    f += 3 + E;
  }
  return out;
}

void StagedGpt::set_grad_ready(std::vector<bool> take, GradReady ready) {
  SW_CHECK(take.size() == params_.size(), "hand-over: {} flags for {} parameters", take.size(), params_.size());
  hand_ = std::move(take);
  copies_.assign(params_.size(), 0);
  for (int s : runner_->local_stages())
    for (size_t p : stage_params_.at(s)) ++copies_[p];
  const pipeline::Schedule& sch = runner_->schedule();
  if (sch.rank_of(0) != sch.rank_of(sch.stages() - 1)) {  // exchanged after the run: not handed over
    const std::string tied = tied_embedding(model_);
    for (size_t p = 0; p < params_.size(); ++p)
      if (params_[p].name == tied) hand_[p] = false;
  }
  grad_ready_ = std::move(ready);
  if (!grad_ready_) {
    runner_->set_grad_ready(nullptr);
    return;
  }
  runner_->set_grad_ready([this](int stage, size_t i, Tensor& sum) {
    const size_t p = stage_params_.at(stage)[i];
    if (!hand_[p]) return;  // stays in the runner's sums
    Tensor& pending = pending_[p];
    if (!pending.defined()) {
      pending = std::move(sum);
    } else {  // a copy on another local stage (the tied embedding)
      pipeline::accumulate_grad(pending, sum);
      sum = Tensor();
    }
    if (--remaining_[p] == 0) grad_ready_(p, pending);
  });
}

// The tied embedding on two pipeline ranks: each side adds the other's gradient.
void StagedGpt::exchange_tied(std::vector<Tensor>& grads) {
  const pipeline::Schedule& sch = runner_->schedule();
  const int S = sch.stages();
  if (sch.rank_of(0) == sch.rank_of(S - 1)) return;
  const std::string tied = tied_embedding(model_);
  auto it = std::find_if(params_.begin(), params_.end(), [&](const ParamState& p) { return p.name == tied; });
  if (it == params_.end()) return;  // a middle stage, or an untied head
  const mesh::ProcessMesh &a = meshes_[0], &b = meshes_[static_cast<size_t>(S - 1)];
  // Both stages lay the copy out alike (the same annotations on meshes of one shape).
  mesh::DistAttr dist = it->dist;
  if (config_.partial_dp_grads)  // each data rank's part goes to its peer
    for (int d : data_group_dims(dist, stage_strategy_.data_dims())) dist.set(d, mesh::Placement::partial());
  if (!tied_) tied_ = std::make_unique<reshard::Resharder>(world_);
  Tensor& mine = grads[static_cast<size_t>(it - params_.begin())];
  const bool on_first = a.contains(my_process(*world_));
  reshard::Plan ab = reshard::plan_reshard(it->shape, DType::F32, {a, dist}, {b, dist});
  reshard::Plan ba = reshard::plan_reshard(it->shape, DType::F32, {b, dist}, {a, dist});
  // On a device: device tensors, on the rank's streams (its stages share them), as the runner's sends.
  runtime::Runtime& rt = runner_->runtime(runner_->local_stages().front());
  Tensor from_first = rt.transfer(*tied_, ab, on_first ? mine : Tensor(), config_.device);
  Tensor from_last = rt.transfer(*tied_, ba, on_first ? Tensor() : mine, config_.device);
  StreamScope on_compute(rt.stream());
  pipeline::accumulate_grad(mine, on_first ? from_last : from_first);
}

std::vector<bool> StagedGpt::grads_partial() const {
  std::vector<bool> out(params_.size(), false);
  const std::vector<int> data = stage_strategy_.data_dims();
  for (int s : runner_->local_stages()) {
    const graph::Program& p = runner_->compiled(s).program;
    const std::vector<size_t>& index = stage_params_.at(s);
    for (size_t i = 0; i < index.size(); ++i) {
      const mesh::DistAttr& got = p.slots[static_cast<size_t>(p.param_grad_slot[i])].dist;
      const std::vector<int> dims = data_group_dims(params_[index[i]].dist, data);
      size_t partial = 0;
      for (int d : dims) {
        SW_CHECK(!got[d].is_partial() || got[d].is_partial(mesh::ReduceOp::Sum),
                 "sharding: the gradient of '{}' is {} over its data dims, expected a sum", params_[index[i]].name,
                 got.to_string());
        partial += got[d].is_partial() ? 1 : 0;
      }
      SW_CHECK(partial == 0 || partial == dims.size(),
               "sharding: the gradient of '{}' is {}: a sum over some of its data group's dims only",
               params_[index[i]].name, got.to_string());
      out[index[i]] = partial > 0;
    }
  }
  return out;
}

const DataGroups& StagedGpt::data_groups() {
  if (groups_) return *groups_;
  groups_ = std::make_unique<DataGroups>();
  const mesh::ProcessMesh& m = meshes_[static_cast<size_t>(runner_->local_stages().front())];
  std::map<std::vector<int>, int> ids;  // the groups in order of their dims (the same on every rank)
  for (const ParamState& p : params_) ids.emplace(data_group_dims(p.dist, stage_strategy_.data_dims()), 0);
  for (auto& [dims, id] : ids) {
    id = static_cast<int>(groups_->dims.size());
    groups_->dims.push_back(dims);
    std::vector<int> members;  // row-major over `dims` in mesh-dim order, as the memory plan counts them
    for (int64_t p : m.processes_along(my_process(*world_), dims)) members.push_back(static_cast<int>(p));
    groups_->comms.push_back(world_->group(members));
  }
  for (const ParamState& p : params_) groups_->of.push_back(ids.at(data_group_dims(p.dist, stage_strategy_.data_dims())));
  return *groups_;
}

double StagedGpt::grad_norm(const std::vector<Tensor>& grads, bool sharded) {
  std::vector<ParamState> counted;
  std::vector<Tensor> counted_grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!counted_[i]) continue;
    counted.push_back(params_[i]);
    counted_grads.push_back(grads[i]);
  }
  return global_grad_norm(counted, counted_grads, meshes_[0], *world_,
                          sharded ? stage_strategy_.data_dims() : std::vector<int>{});
}

std::unique_ptr<pipeline::PipelineRunner> StagedGpt::forward_runner(int micro_batches, StageGraph what) {
  pipeline::Schedule sch = pipeline::forward_only(static_cast<int>(pp_), runner_->schedule().virtual_stages, micro_batches);
  std::vector<pipeline::StageSpec> specs = local_specs(sch, what);
  // On a device, on the training runner's streams: the optimizer's last writes come first.
  pipeline::RunnerOptions ro{true, false, config_.prefetch_params, config_.device};
  if (!config_.device.is_host()) ro.streams_of = &runner_->runtime(runner_->local_stages().front());
  auto runner = std::make_unique<pipeline::PipelineRunner>(std::move(sch), meshes_, std::move(specs), world_, ro);
  bind_constants(*runner, model_, mask_, config_.device);
  return runner;
}

EvalResult StagedGpt::evaluate(const AdditionTask& task, int64_t samples) {
  const int64_t batch = sequences_, S_len = model_.seq;
  const int m = static_cast<int>((samples + batch - 1) / batch);
  if (!eval_ || eval_->schedule().micro_batches != m) eval_ = forward_runner(m, StageGraph::Predictions);
  bind(*eval_);
  std::vector<AdditionTask::Problem> problems;
  for (int64_t i = 0; i < static_cast<int64_t>(m) * batch; ++i) problems.push_back(task.held_out(i));
  int64_t counts[2] = {0, 0};
  auto feed = [&](int stage, int mb, runtime::Runtime& rt) {
    if (stage != 0) return;
    Tensor ids(DType::I64, Shape{batch, S_len});
    for (int64_t i = 0; i < batch; ++i) {
      const auto& t = problems[static_cast<size_t>(mb * batch + i)].tokens;
      std::copy(t.begin(), t.end() - 1, ids.data<int64_t>() + i * S_len);
    }
    if (config_.device.is_host()) rt.set_global("ids", to_cp_order(ids, model_.cp_order));
    else bind_block(rt, "ids", to_cp_order(ids, model_.cp_order), 0, config_.device);
  };
  auto read = [&](int, int mb, runtime::Runtime& rt) {
    Tensor pred = rt.gather(eval_->spec(eval_->schedule().stages() - 1).results.at(0));
    if (pred.on_device()) pred = to_host(pred, rt.stream());
    pred = from_cp_order(pred, model_.cp_order);
    for (int64_t i = 0; i < batch && mb * batch + i < samples; ++i) {
      const auto& p = problems[static_cast<size_t>(mb * batch + i)];
      bool exact = true;
      for (int64_t t = p.answer_begin; t < p.answer_end; ++t)
        exact = exact && pred.data<int64_t>()[i * S_len + t] == p.tokens[static_cast<size_t>(t + 1)];
      ++counts[0];
      counts[1] += exact ? 1 : 0;
    }
  };
  eval_->run(feed, read);
  world_->broadcast(counts, 2, DType::I64, root_of_stage(eval_->schedule().stages() - 1));
  return EvalResult{counts[0], counts[1]};
}

double StagedGpt::validation_loss(const Dataset* data, int64_t count) {
  SW_CHECK(count >= 1, "validation needs at least 1 sequence, got {}", count);
  SW_CHECK(!fed_batches(model_), "{}: validation reads the loader's token ids, and this model takes the batches given to "
           "Trainer.step: evaluate it on your own batches", model_.custom->description);
  const int64_t batch = sequences_, S_len = model_.seq;
  const int m = static_cast<int>((count + batch - 1) / batch);
  if (!val_ || val_->schedule().micro_batches != m) {
    val_ = forward_runner(m, StageGraph::Loss);
    val_loader_ = make_loader(m, LoaderOptions{config_.loader.synchronized, false});
  }
  const int S = val_->schedule().stages();
  // Rows past `count` (the last micro-batch's padding) read token 0 and have every label ignored
  // (cross_entropy's ignore_index -100): they add nothing to the summed loss.
  std::vector<RowBatch> batches = val_loader_->take(data, 0, count);  // before the run's collectives
  auto feed = [&](int stage, int mb, runtime::Runtime& rt) {
    if (stage != 0 && stage != S - 1 && !model_.document_mask) return;
    bind_rows(rt, model_, stage == 0, stage == S - 1, batches[static_cast<size_t>(mb)], config_.device);
  };
  bind(*val_);
  double sum = val_->run(feed).loss_sum;  // the micro-batches' summed cross-entropies, in order
  world_->broadcast(&sum, 1, DType::F64, root_of_stage(S - 1));
  return sum / static_cast<double>(count * S_len);
}

double StagedGpt::fed_loss() {
  SW_CHECK(fed_batches(model_), "fed_loss: the model reads the loader's token ids, not batches given by the caller");
  const int m = runner_->schedule().micro_batches;
  if (!val_ || val_->schedule().micro_batches != m) val_ = forward_runner(m, StageGraph::Loss);
  auto feed = [&](int stage, int mb, runtime::Runtime& rt) {
    rt.set_sample_offset(mb * sequences_);
    bind_fed(rt, *model_.custom, val_->spec(stage), mb * sequences_, sequences_, config_.device);
  };
  bind(*val_);
  double sum = val_->run(feed).loss_sum;  // the micro-batches' mean losses, summed
  world_->broadcast(&sum, 1, DType::F64, root_of_stage(val_->schedule().stages() - 1));
  return sum / m;
}

namespace {

// `t`'s rows [0, rows) followed by copies of its row 0 up to `padded` rows.
Tensor padded_rows(const Tensor& t, int64_t rows, int64_t padded) {
  if (padded == rows) return t;
  Shape shape = t.shape();
  shape[0] = padded;
  Tensor out = Tensor::uninitialized(t.dtype(), shape);
  const size_t row = t.nbytes() / static_cast<size_t>(rows);
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  for (int64_t r = rows; r < padded; ++r) std::memcpy(out.raw() + static_cast<size_t>(r) * row, t.raw(), row);
  return out;
}

// The first `rows` rows of the micro-batches' parts, one after the other.
Tensor joined_rows(const std::vector<Tensor>& parts, int64_t rows, const std::string& name) {
  const Tensor& first = parts.at(0);
  SW_CHECK(first.shape().ndim() >= 1 && first.shape()[0] >= 1, "the output '{}' has shape [{}]: an output's dim 0 is "
           "the batch", name, first.shape().to_string());
  Shape shape = first.shape();
  shape[0] = rows;
  Tensor out = Tensor::uninitialized(first.dtype(), shape);
  const size_t row = first.nbytes() / static_cast<size_t>(first.shape()[0]);
  size_t at = 0;
  for (const Tensor& p : parts) {
    const size_t n = std::min(p.nbytes(), out.nbytes() - at);
    std::memcpy(out.raw() + at, p.raw(), n);
    at += n;
  }
  SW_CHECK(at == static_cast<size_t>(rows) * row, "the output '{}' gave {} rows of {}", name, at / row, rows);
  return out;
}

}  // namespace

std::map<std::string, Tensor> StagedGpt::predict(const std::map<std::string, Tensor>& batch) {
  SW_CHECK(model_.custom && model_.custom->predictions, "evaluate(batch) gives the outputs of a model written in "
           "Python (nn.output); the built-in model's logits come from generate");
  SW_CHECK(!batch.empty() && batch.begin()->second.shape().ndim() >= 1, "evaluate(batch): the batch holds no input");
  SW_CHECK(model_.cp_order <= 1, "evaluate(batch) on a mesh with a cp dim is not built yet (its outputs would be in "
           "cp's order): evaluate on a mesh without cp");
  const int64_t rows = batch.begin()->second.shape()[0], B = sequences_;
  for (const auto& [name, t] : batch)
    SW_CHECK(t.shape().ndim() >= 1 && t.shape()[0] == rows && rows >= 1, "evaluate(batch): the batch's '{}' has shape "
             "[{}], not the {} rows of '{}'", name, t.shape().to_string(), rows, batch.begin()->first);
  const int m = static_cast<int>((rows + B - 1) / B);
  std::map<std::string, Tensor> padded;
  for (const auto& [name, t] : batch) padded[name] = padded_rows(t, rows, m * B);
  if (!predict_ || predict_->schedule().micro_batches != m) predict_ = forward_runner(m, StageGraph::Predictions);
  bind(*predict_);
  auto feed = [&](int stage, int mb, runtime::Runtime& rt) {
    for (const std::string& name : predict_->spec(stage).feeds) {
      auto it = padded.find(name);
      SW_CHECK(it != padded.end(), "evaluate(batch): the batch has no '{}', an input of the model", name);
      bind_block(rt, name, it->second, -mb * B);  // micro-batch row r is row mb x B + r
    }
  };
  std::map<std::string, std::vector<Tensor>> parts;
  auto read = [&](int stage, int mb, runtime::Runtime& rt) {
    for (const std::string& name : predict_->spec(stage).results) {
      std::vector<Tensor>& p = parts[name];
      p.resize(static_cast<size_t>(m));
      p[static_cast<size_t>(mb)] = rt.gather(name);
    }
  };
  predict_->run(feed, read);
  std::map<std::string, Tensor> out;
  for (const auto& [name, p] : parts) out[name] = joined_rows(p, rows, name);
  return out;
}

Tensor StagedGpt::gather_param(const std::string& name, const std::vector<Tensor>* blocks) {
  // The owner: the first stage holding it (by name: the layer's stage; embeddings first; the
  // final norm and an untied head last).
  const int S = static_cast<int>(layers_.size());
  int owner = 0;
  if (is_last_stage_param(model_, name)) owner = S - 1;
  if (const int64_t layer = layer_of_param(model_, name); layer >= 0) {
    for (int s = 0; s < S; ++s)
      if (layers_[static_cast<size_t>(s)].begin <= layer && layer < layers_[static_cast<size_t>(s)].end) owner = s;
  }
  const mesh::ProcessMesh& m = meshes_[static_cast<size_t>(owner)];
  std::vector<std::byte> bytes;
  if (m.contains(my_process(*world_))) {
    auto named = [&](const ParamState& p) { return p.name == name; };
    auto it = std::find_if(params_.begin(), params_.end(), named);
    Tensor mine;
    if (it != params_.end()) {
      mine = blocks ? (*blocks)[static_cast<size_t>(it - params_.begin())] : it->master;
    } else {
      it = std::find_if(frozen_.begin(), frozen_.end(), named);
      SW_CHECK(it != frozen_.end() && !blocks, "no {}parameter named '{}'", blocks ? "trained " : "", name);
      mine = it->param;
    }
    if (mine.on_device()) mine = to_host(mine, stream());  // a device run's block, after its updates on the compute stream
    if (mine.dtype() != DType::F32) mine = mine.to(DType::F32);
    reshard::Plan plan = reshard::plan_reshard(it->shape, DType::F32, {m, it->dist}, {m, mesh::DistAttr(m.ndim())});
    Tensor whole = reshard::Resharder(world_).run(plan, mine);
    std::vector<int64_t> header = {it->shape.ndim()};
    for (int d = 0; d < it->shape.ndim(); ++d) header.push_back(it->shape[d]);
    bytes.resize(header.size() * sizeof(int64_t) + whole.nbytes());
    std::memcpy(bytes.data(), header.data(), header.size() * sizeof(int64_t));
    std::memcpy(bytes.data() + header.size() * sizeof(int64_t), whole.raw(), whole.nbytes());
  }
  bytes = world_->broadcast_bytes(bytes, root_of_stage(owner));
  int64_t ndim = 0;
  std::memcpy(&ndim, bytes.data(), sizeof(int64_t));
  Shape shape;
  for (int64_t d = 0; d < ndim; ++d) {
    int64_t e = 0;
    std::memcpy(&e, bytes.data() + (1 + d) * sizeof(int64_t), sizeof(int64_t));
    shape.push_back(e);
  }
  Tensor out(DType::F32, shape);
  std::memcpy(out.raw(), bytes.data() + (1 + ndim) * sizeof(int64_t), out.nbytes());
  return out;
}

}  // namespace shardwise::train
