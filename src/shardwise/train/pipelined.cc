#include "shardwise/train/pipelined.h"

#include <cstring>

#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/pipeline/validate.h"
#include "shardwise/reshard/executor.h"

namespace shardwise::train {
namespace {

const char* kTied = "transformer.wte.weight";

int64_t my_process(const comm::Communicator& world) { return world.members()[static_cast<size_t>(world.rank())]; }

int world_index(const comm::Communicator& world, int64_t process) {
  const auto& m = world.members();
  auto it = std::find(m.begin(), m.end(), static_cast<int>(process));
  SW_CHECK(it != m.end(), "process {} is not in the communicator", process);
  return static_cast<int>(it - m.begin());
}

}  // namespace

PipelineParallel::PipelineParallel(const GptConfig& model, const Strategy& strategy, bool sequence_parallel,
                                   const PipelineConfig& config, int64_t micro_batch, int micro_batches, uint64_t seed,
                                   const Tensor& causal_mask, std::shared_ptr<comm::Communicator> world)
    : model_(model),
      strategy_(strategy),
      config_(config),
      micro_batch_(micro_batch),
      micro_batches_(micro_batches),
      seed_(seed),
      mask_(causal_mask),
      world_(world) {
  SW_CHECK(strategy_.pp >= 0, "pipeline parallelism needs a mesh dim named pp, got {}", strategy_.mesh.to_string());
  pp_ = strategy_.mesh.dim_size(strategy_.pp);
  pipeline::Schedule schedule = pipeline::make_schedule(pipeline::parse_schedule_kind(config_.schedule),
                                                        static_cast<int>(pp_), micro_batches, config_.virtual_stages);
  pipeline::validate(schedule);
  const int S = schedule.stages();
  layers_ = pipeline::split_layers(static_cast<int>(model_.layers), S, config_.virtual_stages);
  for (int s = 0; s < S; ++s) meshes_.push_back(pipeline::stage_mesh(strategy_.mesh, strategy_.pp, s % pp_, "dp"));
  stage_strategy_ = Strategy::from_mesh(meshes_[0], sequence_parallel);
  const int64_t me = my_process(*world_);
  const int coord = my_pipeline_rank();
  std::vector<pipeline::StageSpec> all = stage_specs(true, micro_batch_), specs;
  for (int s : schedule.stages_of(coord)) specs.push_back(std::move(all[static_cast<size_t>(s)]));
  pipeline::RunnerOptions ro{config_.release, config_.poison_stand_ins};
  runner_ = std::make_unique<pipeline::PipelineRunner>(schedule, meshes_, std::move(specs), world_, ro);
  // Parameters: this process's block of each, from the counter-based generator (as on one device).
  const bool first_here = schedule.rank_of(0) == coord;
  for (int s : runner_->local_stages()) {
    const graph::Graph& g = *runner_->spec(s).graph;
    const graph::Program& p = runner_->compiled(s).program;
    const mesh::ProcessMesh& m = meshes_[static_cast<size_t>(s)];
    auto coords = m.coords(m.rank_index_of_process(me));
    for (graph::ValueId v : g.params()) {
      const graph::Slot& slot = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])];
      const std::string& name = g.value(v).name;
      auto same = std::find_if(params_.begin(), params_.end(), [&](const ParamState& q) { return q.name == name; });
      if (same != params_.end()) {
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
      q.master = init_param_block(model_, name, slot.meta.shape, block.offsets(), block.shape, seed_);
      q.param = q.master;
      q.exp_avg = Tensor(DType::F32, block.shape);
      q.exp_avg_sq = Tensor(DType::F32, block.shape);
      q.decay = slot.meta.shape.ndim() >= 2;
      params_.push_back(std::move(q));
      counted_.push_back(name != kTied || first_here);
    }
  }
  bind(*runner_);
}

PipelineParallel::~PipelineParallel() = default;

std::vector<pipeline::StageSpec> PipelineParallel::stage_specs(bool training, int64_t micro_batch) {
  std::vector<pipeline::StageSpec> out;
  const int S = static_cast<int>(layers_.size());
  for (int s = 0; s < S; ++s) {
    GptPart part{layers_[static_cast<size_t>(s)].begin, layers_[static_cast<size_t>(s)].end, s == 0, s == S - 1};
    GptGraph gpt = build_gpt(model_, stage_strategy_, micro_batch, training, part);
    pipeline::StageSpec spec;
    spec.stage = s;
    spec.training = training;
    spec.graph = std::make_shared<graph::Graph>(std::move(gpt.g));
    const graph::Graph& g = *spec.graph;
    if (gpt.input >= 0) spec.input = g.value(gpt.input).name;
    if (gpt.output >= 0) spec.output = g.value(gpt.output).name, spec.output_grad = g.value(gpt.output_grad).name;
    if (gpt.loss >= 0) spec.loss = g.value(gpt.loss).name;
    if (gpt.predictions >= 0) spec.result = g.value(gpt.predictions).name;
    if (s == 0) spec.feeds.push_back("ids");
    if (s == S - 1 && training) spec.feeds.push_back("labels");
    spec.constants = {"causal_mask"};
    out.push_back(std::move(spec));
  }
  return out;
}

void PipelineParallel::bind(pipeline::PipelineRunner& runner) {
  for (int s : runner.local_stages()) {
    runtime::Runtime& rt = runner.runtime(s);
    for (graph::ValueId v : runner.spec(s).graph->params()) {
      const std::string& name = runner.spec(s).graph->value(v).name;
      for (ParamState& p : params_)
        if (p.name == name) rt.set_local(name, p.param);
    }
    rt.set_global("causal_mask", mask_);
  }
}

int PipelineParallel::my_pipeline_rank() const {
  auto coords = strategy_.mesh.coords(strategy_.mesh.rank_index_of_process(my_process(*world_)));
  return static_cast<int>(coords[static_cast<size_t>(strategy_.pp)]);
}

int PipelineParallel::root_of_stage(int stage) const {
  return world_index(*world_, meshes_[static_cast<size_t>(stage)].process_ids()[0]);
}

PipelineParallel::Result PipelineParallel::forward_backward(const Dataset& data, int64_t first) {
  const pipeline::Schedule& sch = runner_->schedule();
  const int S = sch.stages();
  auto feed = [&](int stage, int mb, runtime::Runtime& rt) {
    Batch b = make_batch(data, first + mb * micro_batch_, micro_batch_, model_.seq);
    if (stage == 0) rt.set_global("ids", b.ids);
    if (stage == S - 1) rt.set_global("labels", b.labels);
  };
  Result r;
  last_stats_ = runner_->run(feed);
  r.loss = last_stats_.loss_sum;
  world_->broadcast(&r.loss, 1, DType::F64, root_of_stage(S - 1));
  r.grads.resize(params_.size());
  for (int s : runner_->local_stages()) {
    const graph::Graph& g = *runner_->spec(s).graph;
    const auto& grads = runner_->grads(s);
    auto ids = g.params();
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string& name = g.value(ids[i]).name;
      size_t k = static_cast<size_t>(
          std::find_if(params_.begin(), params_.end(), [&](const ParamState& p) { return p.name == name; }) -
          params_.begin());
      if (!r.grads[k].defined()) {
        r.grads[k] = grads[i];
      } else {  // a tied copy on another local stage
        float* acc = r.grads[k].data<float>();
        for (int64_t j = 0; j < grads[i].numel(); ++j) acc[j] += grads[i].data<float>()[j];
      }
    }
  }
  // The tied embedding on two pipeline ranks: each side adds the other's gradient.
  if (S > 1 && sch.rank_of(0) != sch.rank_of(S - 1)) {
    auto it = std::find_if(params_.begin(), params_.end(), [](const ParamState& p) { return p.name == kTied; });
    const mesh::ProcessMesh &a = meshes_[0], &b = meshes_[static_cast<size_t>(S - 1)];
    Shape shape{model_.vocab, model_.hidden};
    // Both stages lay the copy out alike (the same annotations on meshes of one shape).
    mesh::DistAttr dist = it != params_.end() ? it->dist : mesh::DistAttr(a.ndim());
    if (!tied_) tied_ = std::make_unique<reshard::Resharder>(world_);
    bool holds = it != params_.end();
    SW_CHECK(!holds || a.ndim() == dist.mesh_ndim(), "internal: tied embedding layout");
    if (holds) {
      Tensor mine = r.grads[static_cast<size_t>(it - params_.begin())];
      const bool on_first = a.contains(my_process(*world_));
      reshard::Plan ab = reshard::plan_reshard(shape, DType::F32, {a, dist}, {b, dist});
      reshard::Plan ba = reshard::plan_reshard(shape, DType::F32, {b, dist}, {a, dist});
      Tensor from_first = tied_->run(ab, on_first ? mine : Tensor());
      Tensor from_last = tied_->run(ba, on_first ? Tensor() : mine);
      const Tensor& other = on_first ? from_last : from_first;
      float* acc = mine.data<float>();
      for (int64_t j = 0; j < mine.numel(); ++j) acc[j] += other.data<float>()[j];
    }
  }
  return r;
}

double PipelineParallel::grad_norm(const std::vector<Tensor>& grads) {
  std::vector<ParamState> counted;
  std::vector<Tensor> counted_grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!counted_[i]) continue;
    counted.push_back(params_[i]);
    counted_grads.push_back(grads[i]);
  }
  return global_grad_norm(counted, counted_grads, meshes_[0], *world_);
}

std::pair<int64_t, int64_t> PipelineParallel::evaluate(const AdditionTask& task, int64_t samples) {
  const int64_t batch = micro_batch_, S_len = model_.seq;
  const int m = static_cast<int>((samples + batch - 1) / batch);
  if (!eval_ || eval_->schedule().micro_batches != m) {
    pipeline::Schedule sch = pipeline::forward_only(static_cast<int>(pp_), config_.virtual_stages, m);
    std::vector<pipeline::StageSpec> all = stage_specs(false, batch), specs;
    for (int s : sch.stages_of(my_pipeline_rank())) specs.push_back(std::move(all[static_cast<size_t>(s)]));
    eval_ = std::make_unique<pipeline::PipelineRunner>(sch, meshes_, std::move(specs), world_,
                                                       pipeline::RunnerOptions{true, false});
    bind(*eval_);
  }
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
    rt.set_global("ids", ids);
  };
  auto read = [&](int, int mb, runtime::Runtime& rt) {
    Tensor pred = rt.gather(eval_->spec(eval_->schedule().stages() - 1).result);
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
  return {counts[0], counts[1]};
}

Tensor PipelineParallel::gather_param(const std::string& name) {
  // The owner: the first stage holding it (by name: the layer's stage; embeddings first; ln_f last).
  const int S = static_cast<int>(layers_.size());
  int owner = 0;
  if (name.starts_with("transformer.ln_f")) owner = S - 1;
  if (name.starts_with("transformer.h.")) {
    int layer = std::stoi(name.substr(std::strlen("transformer.h.")));
    for (int s = 0; s < S; ++s)
      if (layers_[static_cast<size_t>(s)].begin <= layer && layer < layers_[static_cast<size_t>(s)].end) owner = s;
  }
  const mesh::ProcessMesh& m = meshes_[static_cast<size_t>(owner)];
  std::vector<std::byte> bytes;
  if (m.contains(my_process(*world_))) {
    auto it = std::find_if(params_.begin(), params_.end(), [&](const ParamState& p) { return p.name == name; });
    SW_CHECK(it != params_.end(), "no parameter named '{}'", name);
    const graph::Graph& g = *runner_->spec(owner).graph;
    Shape shape = g.value(g.get(name)).meta.shape;
    reshard::Plan plan = reshard::plan_reshard(shape, DType::F32, {m, it->dist}, {m, mesh::DistAttr(m.ndim())});
    Tensor whole = reshard::Resharder(world_).run(plan, it->master);
    std::vector<int64_t> header = {shape.ndim()};
    for (int d = 0; d < shape.ndim(); ++d) header.push_back(shape[d]);
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
