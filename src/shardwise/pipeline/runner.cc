#include "shardwise/pipeline/runner.h"

#include <unordered_set>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "shardwise/core/error.h"
#include "shardwise/ops/train_kernels.h"
#include "shardwise/reshard/plan.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::pipeline {

struct PipelineRunner::Local {
  StageSpec spec;
  CompiledStage compiled;
  std::unique_ptr<runtime::Runtime> rt;
  std::vector<Tensor> shared;                  // parameters and constants, in every frame
  std::map<int, std::vector<Tensor>> frames;  // micro-batches in flight
  std::map<int, int64_t> sample_offsets;      // theirs (a recomputed dropout draws the forward's mask)
  std::vector<Tensor> grads;
  std::vector<bool> handed;                    // this step: grads[i] given to grad_ready_
  std::vector<std::vector<size_t>> grads_at;  // per execution position: the parameters whose gradient it writes
  size_t last_action = SIZE_MAX;               // the stage's last backward action (its sums complete there)
  std::unordered_set<const void*> held;   // add_to_sum, one micro-batch: storage not to take
  int accumulated = 0;
  reshard::Plan to_next, from_prev, grad_to_prev, grad_from_next;
};

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The plan moving a value laid out `dist` on `from` to the same layout on `to` (meshes of one shape).
reshard::Plan transfer(const graph::Slot& slot, const mesh::ProcessMesh& from, const mesh::ProcessMesh& to) {
  return reshard::plan_reshard(slot.meta.shape, slot.meta.dtype, {from, slot.dist}, {to, slot.dist});
}

Tensor take(std::map<std::pair<int, int>, Tensor>& box, int stage, int mb, const char* what) {
  auto it = box.find({stage, mb});
  SW_CHECK(it != box.end(), "pipeline: stage {} micro-batch {}: its {} is not there (the schedule is invalid)", stage,
           mb, what);
  Tensor t = std::move(it->second);
  box.erase(it);
  return t;
}

// Where a tensor's bytes are (host or device memory): what two tensors share.
const void* storage_of(const Tensor& t) { return t.on_device() ? t.device_ptr() : static_cast<const void*>(t.raw()); }

// A scalar the host needs (a loss): from a device in one copy on the rank's compute stream.
double host_value(runtime::Runtime& rt, const Tensor& t) {
  return (t.on_device() ? to_host(t, rt.stream()) : t).at(0);
}

}  // namespace

void accumulate_grad(Tensor& sum, const Tensor& g) {
  if (g.on_device()) return ops::accumulate_on_device(sum, g);  // the device's kernel, the same sums
  if (!sum.defined()) {
    sum = g.dtype() == DType::F32 ? g.clone() : g.to(DType::F32);  // bf16 parameters: the update is in f32
    return;
  }
  const Tensor add = g.dtype() == DType::F32 ? g : g.to(DType::F32);
  SW_CHECK(sum.dtype() == DType::F32 && sum.numel() == add.numel(), "accumulate_grad: {} {} += {} {}",
           dtype_name(sum.dtype()), sum.shape().to_string(), dtype_name(g.dtype()), g.shape().to_string());
  float* acc = sum.data<float>();
  const float* in = add.data<float>();
  for (int64_t j = 0; j < add.numel(); ++j) acc[j] += in[j];
}

PipelineRunner::PipelineRunner(Schedule schedule, std::vector<mesh::ProcessMesh> stage_meshes,
                               std::vector<StageSpec> local, std::shared_ptr<comm::Communicator> world,
                               RunnerOptions options)
    : schedule_(std::move(schedule)),
      meshes_(std::move(stage_meshes)),
      world_(world),
      p2p_(world->group(world->members())),
      options_(options),
      resharder_(p2p_) {
  const int S = schedule_.stages();
  SW_CHECK(static_cast<int>(meshes_.size()) == S, "pipeline: {} stage meshes for {} stages", meshes_.size(), S);
  SW_CHECK(!local.empty(), "pipeline: this process holds no stage");
  rank_ = schedule_.rank_of(local.front().stage);
  stages_ = schedule_.stages_of(rank_);
  SW_CHECK(local.size() == stages_.size(), "pipeline: pipeline rank {} holds {} stages, {} given", rank_,
           stages_.size(), local.size());
  std::sort(local.begin(), local.end(), [](const StageSpec& a, const StageSpec& b) { return a.stage < b.stage; });
  for (size_t i = 0; i < local.size(); ++i) {
    SW_CHECK(local[i].stage == stages_[i], "pipeline: rank {} holds stages {}, got stage {}", rank_,
             fmt::join(stages_, ", "), local[i].stage);
    auto l = std::make_unique<Local>();
    l->spec = std::move(local[i]);
    const int s = l->spec.stage;
    l->compiled = compile_stage(l->spec, meshes_[static_cast<size_t>(s)], schedule_.split_backward);
    runtime::RuntimeOptions ro;
    ro.order = l->compiled.order;
    ro.release_shape_only_reads = options_.release;
    ro.poison_stand_ins = options_.poison_stand_ins;
    ro.prefetch_params = options_.prefetch_params;
    l->rt = std::make_unique<runtime::Runtime>(*l->spec.graph, l->compiled.program, world, ro);
    if (!options_.device.is_host()) {  // one pair of streams for the rank's stages
      if (!locals_.empty()) l->rt->share_streams(*locals_.front()->rt);
      else if (options_.streams_of) l->rt->share_streams(*options_.streams_of);
      else l->rt->use_device(options_.device);
    }
    const graph::Program& p = l->compiled.program;
    auto slot = [&](const std::string& name) -> const graph::Slot& {
      return p.slots[static_cast<size_t>(l->rt->value_slot(name))];
    };
    for (const std::string& f : l->spec.feeds) l->rt->free_after_use(f);
    if (!l->spec.input.empty()) {
      l->rt->free_after_use(l->spec.input);
      l->from_prev = transfer(slot(l->spec.input), meshes_[static_cast<size_t>(s - 1)], meshes_[static_cast<size_t>(s)]);
      if (l->spec.training)
        l->grad_to_prev = transfer(slot(l->compiled.input_grad), meshes_[static_cast<size_t>(s)],
                                   meshes_[static_cast<size_t>(s - 1)]);
    }
    if (!l->spec.output.empty()) {
      l->rt->keep(l->spec.output);
      l->to_next = transfer(slot(l->spec.output), meshes_[static_cast<size_t>(s)], meshes_[static_cast<size_t>(s + 1)]);
      if (l->spec.training) {
        l->rt->free_after_use(l->spec.output_grad);
        l->grad_from_next = transfer(slot(l->spec.output_grad), meshes_[static_cast<size_t>(s + 1)],
                                     meshes_[static_cast<size_t>(s)]);
      }
    }
    if (l->spec.training) {
      const size_t n = l->compiled.order.empty() ? p.instrs.size() : l->compiled.order.size();
      l->grads_at.resize(n);
      for (size_t pos = 0; pos < n; ++pos) {
        const graph::Instr& ins = p.instrs[l->compiled.order.empty() ? pos : static_cast<size_t>(l->compiled.order[pos])];
        for (int out : ins.out)
          for (size_t i = 0; i < p.param_grad_slot.size(); ++i)
            if (out >= 0 && p.param_grad_slot[i] == out) l->grads_at[pos].push_back(i);
      }
      const std::vector<Action>& actions = schedule_.actions[static_cast<size_t>(rank_)];
      for (size_t k = 0; k < actions.size(); ++k)
        if (actions[k].stage == s && (actions[k].kind == ActionKind::Backward || actions[k].kind == ActionKind::BackwardWeight))
          l->last_action = k;
    }
    if (!l->spec.loss.empty()) l->rt->keep(l->spec.loss);
    for (const std::string& name : l->spec.results) l->rt->keep(name);
    for (const std::string& name : l->spec.stats) l->rt->keep(name);
    if (!l->spec.extra_loss.empty()) l->rt->keep(l->spec.extra_loss);
    locals_.push_back(std::move(l));
  }
}

PipelineRunner::~PipelineRunner() = default;

template <class Self>
auto& PipelineRunner::local_of(Self& self, int stage) {
  auto it = std::find(self.stages_.begin(), self.stages_.end(), stage);
  SW_CHECK(it != self.stages_.end(), "pipeline: stage {} is not on pipeline rank {} (it holds {})", stage, self.rank_,
           fmt::join(self.stages_, ", "));
  using L = std::conditional_t<std::is_const_v<Self>, const Local, Local>;
  return static_cast<L&>(*self.locals_[static_cast<size_t>(it - self.stages_.begin())]);
}

PipelineRunner::Local& PipelineRunner::local(int stage) { return local_of(*this, stage); }
const StageSpec& PipelineRunner::spec(int stage) const { return local_of(*this, stage).spec; }
const CompiledStage& PipelineRunner::compiled(int stage) const { return local_of(*this, stage).compiled; }
runtime::Runtime& PipelineRunner::runtime(int stage) { return *local(stage).rt; }
const runtime::Runtime& PipelineRunner::runtime(int stage) const { return *local_of(*this, stage).rt; }
const std::vector<Tensor>& PipelineRunner::grads(int stage) const { return local_of(*this, stage).grads; }

void PipelineRunner::release_grads() {
  for (int s : stages_) local_of(*this, s).grads.clear();
}

int64_t PipelineRunner::frame_bytes(const Local& l, const std::vector<Tensor>& frame) const {
  int64_t bytes = 0;
  for (size_t i = 0; i < frame.size(); ++i) {
    const Tensor& t = frame[i];
    bool shared = i < l.shared.size() && l.shared[i].defined() && storage_of(t) == storage_of(l.shared[i]);
    if (t.defined() && !shared) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

int64_t PipelineRunner::activation_bytes() const {
  int64_t bytes = 0;
  for (const auto& l : locals_)
    for (const auto& [mb, frame] : l->frames) bytes += frame_bytes(*l, frame);
  return bytes;
}

void PipelineRunner::forward(Local& l, int mb, const Feed& feed, const Feed& on_result, StepStats& stats) {
  runtime::Runtime& rt = *l.rt;
  const int s = l.spec.stage;
  rt.set_buffers(l.shared);
  if (!l.spec.input.empty()) rt.set_local(l.spec.input, take(inbox_act_, s, mb, "input activation"));
  if (feed) feed(s, mb, rt);
  rt.run(0, l.compiled.forward_end);
  if (!l.spec.loss.empty()) {
    stats.loss_sum += host_value(rt, rt.gather(l.spec.loss));  // kept (a scalar): its gradient node reads it
  }
  if (!l.spec.results.empty() && on_result) on_result(s, mb, rt);
  if (!l.spec.extra_loss.empty()) stats.extra_loss_sums[s] += host_value(rt, rt.gather(l.spec.extra_loss));
  for (const std::string& name : l.spec.stats) {
    Tensor t = rt.gather(name);
    if (t.on_device()) t = to_host(t, rt.stream());  // one copy of the statistic (MoE routing)
    std::vector<double>& sum = stats.stat_sums[name];
    sum.resize(static_cast<size_t>(t.numel()), 0.0);
    for (int64_t i = 0; i < t.numel(); ++i) sum[static_cast<size_t>(i)] += t.at(i);
  }
  if (!l.spec.output.empty()) {
    Tensor out = rt.local(l.spec.output);
    bool next_here = schedule_.rank_of(s + 1) == rank_;
    (next_here ? inbox_act_ : outbox_act_)[{next_here ? s + 1 : s, mb}] = out;
    if (options_.release || !l.spec.training) rt.drop(l.spec.output);
  }
  if (!l.spec.training) {
    rt.set_buffers(l.shared);
    return;
  }
  l.frames[mb] = rt.take_buffers();
  l.sample_offsets[mb] = rt.sample_offset();
  if (!stats.forward_bytes.contains(s)) stats.forward_bytes[s] = frame_bytes(l, l.frames[mb]);
}

void PipelineRunner::add_to_sum(Local& l, size_t i) {
  const graph::Program& p = l.compiled.program;
  const int slot = p.param_grad_slot[static_cast<size_t>(i)];
  const Tensor& g = l.rt->buffers()[static_cast<size_t>(slot)];
  SW_CHECK(g.defined(), "pipeline: stage {} has no gradient for '{}'", l.spec.stage,
           p.slots[static_cast<size_t>(slot)].name);
  // With one micro-batch the sums are the gradients themselves: the runtime lets go of this
  // backward's buffers right after (set_buffers(l.shared)), so an f32 gradient is taken, not
  // copied, unless its storage is also held by a kept buffer (a parameter, a constant) or by a
  // gradient taken already (the caller scales and clips the sums in place).
  if (schedule_.micro_batches == 1 && g.dtype() == DType::F32 && g.numel() > 0 && l.held.insert(storage_of(g)).second) {
    l.grads[i] = g;
    return;
  }
  accumulate_grad(l.grads[i], g);
}

void PipelineRunner::hand_over(Local& l, size_t i) {
  if (l.handed[i]) return;
  add_to_sum(l, i);
  l.handed[i] = true;
  const void* storage = storage_of(l.grads[i]);
  grad_ready_(l.spec.stage, i, l.grads[i]);
  if (!l.grads[i].defined()) l.held.erase(storage);  // the callee's now: once it lets go, a later gradient may reuse it
  // The gradient's buffer goes now rather than at the action's end: what is still needed is the
  // sum (the runner's or the callee's), so a sum the callee takes and drops frees its bytes.
  l.rt->release(l.compiled.program.param_grad_slot[i]);
}

void PipelineRunner::accumulate(Local& l) {
  const graph::Program& p = l.compiled.program;
  for (size_t i = 0; i < p.param_grad_slot.size(); ++i) {
    if (p.param_grad_slot[i] < 0 || l.handed[i]) continue;
    if (grad_ready_ && action_ == l.last_action) hand_over(l, i);
    else add_to_sum(l, i);
  }
  ++l.accumulated;
}

void PipelineRunner::backward(Local& l, int mb, ActionKind kind, StepStats& stats) {
  runtime::Runtime& rt = *l.rt;
  const int s = l.spec.stage;
  auto it = l.frames.find(mb);
  SW_CHECK(it != l.frames.end(), "pipeline: stage {} micro-batch {}: backward without its forward", s, mb);
  rt.set_buffers(std::move(it->second));
  l.frames.erase(it);
  rt.set_sample_offset(l.sample_offsets.at(mb));
  l.held.clear();  // add_to_sum: the storage of the kept buffers, then of the gradients taken
  if (schedule_.micro_batches == 1) {
    for (const Tensor& t : l.shared) {
      if (t.defined()) l.held.insert(storage_of(t));
    }
  }
  // The stage's last backward action (a split schedule's last weight gradient: the input gradient
  // of the last micro-batch may run before other micro-batches' weight gradients): each gradient
  // is handed on when computed.
  if (grad_ready_ && action_ == l.last_action) {
    rt.set_after_instr([this, &l](size_t pos) {
      for (size_t i : l.grads_at[pos]) hand_over(l, i);
    });
  }
  struct Unhook {
    runtime::Runtime& rt;
    ~Unhook() { rt.set_after_instr(nullptr); }
  } unhook{rt};
  if (kind == ActionKind::BackwardWeight) {
    rt.run(l.compiled.input_grad_end, rt.size());
  } else {
    if (!l.spec.output.empty()) rt.set_local(l.spec.output_grad, take(inbox_grad_, s, mb, "output gradient"));
    rt.run(l.compiled.forward_end, kind == ActionKind::Backward ? rt.size() : l.compiled.input_grad_end);
    if (!l.compiled.input_grad.empty()) {
      bool prev_here = schedule_.rank_of(s - 1) == rank_;
      (prev_here ? inbox_grad_ : outbox_grad_)[{prev_here ? s - 1 : s, mb}] = rt.local(l.compiled.input_grad);
      rt.drop(l.compiled.input_grad);
    }
    if (kind == ActionKind::BackwardInput) {
      l.frames[mb] = rt.take_buffers();
      if (!stats.weight_grad_bytes.contains(s)) stats.weight_grad_bytes[s] = frame_bytes(l, l.frames[mb]);
      return;
    }
  }
  {
    StreamScope on_compute(rt.stream());  // a device's sums follow the backward's kernels
    accumulate(l);
  }
  l.sample_offsets.erase(mb);
  rt.set_buffers(l.shared);
}

Tensor PipelineRunner::send_or_receive(Local& l, const reshard::Plan& plan, const Tensor& t) {
  return l.rt->transfer(resharder_, plan, t, options_.device);
}

StepStats PipelineRunner::run(const Feed& feed, const Feed& on_result) {
  StepStats stats;
  for (auto& l : locals_) {
    l->shared = l->rt->buffers();
    l->accumulated = 0;
    // New sums: the last run's are the caller's.
    l->grads.assign(l->compiled.program.param_grad_slot.size(), Tensor());
    l->handed.assign(l->grads.size(), false);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Action>& actions = schedule_.actions[static_cast<size_t>(rank_)];
  for (action_ = 0; action_ < actions.size(); ++action_) {
    const Action& a = actions[action_];
    const double start = seconds_since(t0);
    switch (a.kind) {
      case ActionKind::Forward: forward(local(a.stage), a.micro_batch, feed, on_result, stats); break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
      case ActionKind::BackwardWeight: backward(local(a.stage), a.micro_batch, a.kind, stats); break;
      case ActionKind::SendActivation:
        send_or_receive(local(a.stage), local(a.stage).to_next,
                        take(outbox_act_, a.stage, a.micro_batch, "output activation"));
        break;
      case ActionKind::RecvActivation:
        inbox_act_[{a.stage, a.micro_batch}] = send_or_receive(local(a.stage), local(a.stage).from_prev, Tensor());
        break;
      case ActionKind::SendGrad:
        send_or_receive(local(a.stage), local(a.stage).grad_to_prev,
                        take(outbox_grad_, a.stage, a.micro_batch, "input gradient"));
        break;
      case ActionKind::RecvGrad:
        inbox_grad_[{a.stage, a.micro_batch}] = send_or_receive(local(a.stage), local(a.stage).grad_from_next, Tensor());
        break;
      case ActionKind::OptimizerStep: break;  // the caller's, after run()
    }
    const double end = seconds_since(t0);
    stats.timeline.push_back({a, start, end});
    if (is_compute(a.kind)) {
      stats.compute_seconds += end - start;
      stats.peak_gathered_bytes = std::max(stats.peak_gathered_bytes, local(a.stage).rt->stats().peak_gathered_bytes);
      stats.peak_bytes = std::max(stats.peak_bytes, local(a.stage).rt->stats().peak_bytes);
      stats.prefetched_gathers += local(a.stage).rt->stats().prefetched;
    }
    stats.peak_activation_bytes = std::max(stats.peak_activation_bytes, activation_bytes());
  }
  stats.seconds = seconds_since(t0);
  for (auto& l : locals_) {
    SW_CHECK(l->frames.empty(), "pipeline: stage {} ends the step with {} micro-batches in flight", l->spec.stage,
             l->frames.size());
    l->rt->set_buffers(l->shared);
  }
  SW_CHECK(inbox_act_.empty() && inbox_grad_.empty() && outbox_act_.empty() && outbox_grad_.empty(),
           "pipeline: rank {} ends the step with undelivered activations or gradients", rank_);
  return stats;
}

}  // namespace shardwise::pipeline
