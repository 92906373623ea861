#include "shardwise/runtime/runtime.h"
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>

#include "shardwise/core/error.h"
#include "shardwise/graph/prefetch.h"
#include "shardwise/comm/device_buffers.h"
#include "shardwise/ops/device_kernels.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/runtime/profiler.h"
#include "shardwise/runtime/stand_in.h"
#include "shardwise/tensor/allocator.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_allocator.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::runtime {

using graph::InstrKind;
using graph::ValueId;

namespace {

// Training allocates and frees the same large buffers every step. glibc returns blocks above its
// mmap threshold to the kernel on free, so each step would fault every page in again; keeping them
// in the heap makes the next step reuse them.
void keep_freed_memory() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)done;
}

// The device of a run: where its bound tensors are (the first one on a device), else the host. A
// run's Fill instructions make their tensors there.
Device run_device(const std::vector<Tensor>& buffers) {
  for (const Tensor& t : buffers) {
    if (t.on_device()) [[unlikely]] return t.device();
  }
  return Device::host();
}

}  // namespace

Runtime::Runtime(const graph::Graph& g, const graph::Program& p, std::shared_ptr<comm::Communicator> world,
                 RuntimeOptions options)
    : g_(g), p_(p), options_(std::move(options)), world_(world), resharder_(world) {
  keep_freed_memory();
  mesh_comm_ = std::make_unique<comm::MeshComm>(p.mesh, world_->group(world_->members()));
  coords_ = p.mesh.coords(mesh_comm_->rank_index());
  order_ = options_.order;
  if (order_.empty()) {
    for (size_t i = 0; i < p.instrs.size(); ++i) order_.push_back(static_cast<int>(i));
  }
  std::vector<bool> seen(p.instrs.size(), false);
  for (int i : order_) {
    SW_CHECK(i >= 0 && static_cast<size_t>(i) < p.instrs.size() && !seen[static_cast<size_t>(i)],
             "runtime: the execution order must be a permutation of the {} instructions (bad or repeated {})",
             p.instrs.size(), i);
    seen[static_cast<size_t>(i)] = true;
  }
  SW_CHECK(order_.size() == p.instrs.size(), "runtime: the execution order names {} of the {} instructions",
           order_.size(), p.instrs.size());
  buffers_.resize(p.slots.size());
  kept_.assign(p.slots.size(), false);
  last_use_.assign(p.slots.size(), -1);
  std::vector<bool> read(p.slots.size(), false);  // read by some instruction, value or shape
  for (size_t pos = 0; pos < order_.size(); ++pos) {
    const graph::Instr& ins = p.instrs[static_cast<size_t>(order_[pos])];
    for (size_t k = 0; k < ins.in.size(); ++k) {
      int s = ins.in[k];
      if (s < 0) continue;
      read[static_cast<size_t>(s)] = true;
      if (reads_value(ins, k)) last_use_[static_cast<size_t>(s)] = static_cast<int>(pos);
    }
  }
  // Leaves (bound by the caller), parameter gradients and values nobody reads stay (a result);
  // not a recompute copy nor a value the backward reads a copy of instead (graph/recompute.h): an
  // output of a repeated op nobody reads goes at once, an original after its forward use.
  for (const graph::Value& v : g.values()) {
    int s = p.value_slot[static_cast<size_t>(v.id)];
    if (s < 0) continue;
    bool recomputed = v.recompute_copy >= 0 || (v.producer >= 0 && g.node(v.producer).recomputes >= 0);
    if (v.producer < 0 || (!read[static_cast<size_t>(s)] && !recomputed)) kept_[static_cast<size_t>(s)] = true;
  }
  for (int s : p.param_grad_slot) {
    if (s >= 0) kept_[static_cast<size_t>(s)] = true;
  }
  // Slots nothing produces: a gathered parameter read for its shape only (LowerOptions::regather_params).
  unproduced_.assign(p.slots.size(), true);
  for (int s : p.value_slot)
    if (s >= 0) unproduced_[static_cast<size_t>(s)] = false;
  for (const graph::Instr& ins : p.instrs)
    for (int s : ins.out)
      if (s >= 0) unproduced_[static_cast<size_t>(s)] = false;
  gathered_.assign(p.slots.size(), false);
  for (size_t s = 0; s < p.slots.size(); ++s) {
    const graph::ValueId v = p.slots[s].value;
    gathered_[s] = v >= 0 && g.value(v).kind == graph::ValueKind::Param &&
                   p.value_slot[static_cast<size_t>(v)] != static_cast<int>(s);
  }
}

Runtime::~Runtime() = default;

void Runtime::use_device(Device device) {
  if (streams_) {
    SW_CHECK(streams_->device == device, "runtime: a run on {} after runs on {}; one runtime runs on one device",
             device.to_string(), streams_->device.to_string());
    return;
  }
  DeviceMemory& memory = device_memory(device);
  streams_ = std::shared_ptr<const DeviceStreams>(
      new DeviceStreams{device, memory.create_stream(), memory.create_stream()}, [](const DeviceStreams* s) {
        DeviceMemory& m = device_memory(s->device);
        m.destroy_stream(s->compute);
        m.destroy_stream(s->comm);
        delete s;
      });
}

void Runtime::share_streams(const Runtime& other) {
  SW_CHECK(other.streams_, "runtime: share_streams with a runtime that has no streams (no device run yet)");
  SW_CHECK(!streams_ || streams_ == other.streams_, "runtime: share_streams after runs on its own streams");
  streams_ = other.streams_;
}

Tensor Runtime::reshard(const reshard::Plan& plan, const Tensor& in) {
  if (!in.on_device() && (in.defined() || !streams_)) [[likely]] return resharder_.run(plan, in);
  return transfer(resharder_, plan, in, in.defined() ? in.device() : streams_->device);
}

// A reshard of device blocks runs the resharder on them (device copies, collectives on device
// pointers) on the communication stream, after an event of the compute stream; the compute stream
// goes on after an event of the communication stream. A process outside the plan's source mesh
// (no input block) of a device run gets its block on the run's device.
Tensor Runtime::transfer(reshard::Resharder& resharder, const reshard::Plan& plan, const Tensor& in, Device device) {
  if (device.is_host()) return resharder.run(plan, in);
  Prefetched queued = reshard_on_comm(resharder, plan, in, device);
  return wait_on_compute(queued);
}

Runtime::Prefetched Runtime::reshard_on_comm(reshard::Resharder& resharder, const reshard::Plan& plan, const Tensor& in,
                                             Device device) {
  use_device(device);
  DeviceMemory& memory = device_memory(device);
  const uint64_t ready = memory.record_event(streams_->compute);  // the input is written
  memory.wait_event(streams_->comm, ready);
  memory.release_event(ready);
  Prefetched out;
  {
    StreamScope scope(streams_->comm);
    comm::DeviceBuffers on_device(device, streams_->comm);
    out.out = resharder.run(plan, in);
  }
  out.done = memory.record_event(streams_->comm);  // the output is written
  out.fresh = out.out.defined() && (!in.defined() || out.out.device_ptr() != in.device_ptr());
  return out;
}

Tensor Runtime::wait_on_compute(Prefetched& queued) {
  if (queued.host) return queued.host->wait();
  DeviceMemory& memory = device_memory(streams_->device);
  memory.wait_event(streams_->compute, queued.done);
  memory.release_event(queued.done);
  // Made on the communication stream, read on the compute stream: its block is not reused on the
  // former before the latter's work queued now has run. (The input and the peers' reads of it are
  // covered by the compute stream's wait: the collectives' last step waits for every peer.)
  if (queued.fresh) device_allocator(streams_->device).record_use(queued.out.device_ptr(), streams_->compute);
  return std::move(queued.out);
}

bool Runtime::reads_value(const graph::Instr& ins, size_t k) const {
  if (!options_.release_shape_only_reads || ins.kind != InstrKind::Backward) return true;
  const graph::Node& n = g_.node(ins.node);
  size_t forward_tensors = g_.node(n.forward).inputs.size() + g_.node(n.forward).outputs.size();
  return k >= forward_tensors || ops::op_registry().get(n.op).backward_reads_value(static_cast<int>(k), n.attrs);
}

Tensor shape_only_tensor(DType dtype, const Shape& shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (bytes < kCachedFrom) return Tensor::uninitialized(dtype, shape);
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  SW_CHECK(p != MAP_FAILED, "runtime: no address space for a stand-in of {} bytes ({} {})", bytes, dtype_name(dtype),
           shape.to_string());
  std::shared_ptr<std::byte[]> storage(static_cast<std::byte*>(p), [bytes](std::byte* q) { ::munmap(q, bytes); });
  return Tensor::adopt(dtype, shape, std::move(storage));
}

Tensor Runtime::stand_in(int slot, Device device) const {
  const graph::Slot& s = p_.slots[static_cast<size_t>(slot)];
  Shape local = mesh::local_shape(s.meta.shape, s.dist, p_.mesh, coords_);
  if (!device.is_host()) return empty_on(s.meta.dtype, local, device, current_stream());  // never read
  if (options_.poison_stand_ins && is_floating(s.meta.dtype)) return Tensor::full(s.meta.dtype, local, std::nan(""));
  return shape_only_tensor(s.meta.dtype, local);
}

void Runtime::free_after_use(std::string_view name) { kept_[static_cast<size_t>(value_slot(name))] = false; }

void Runtime::drop(std::string_view name) { buffers_[static_cast<size_t>(value_slot(name))] = Tensor(); }

void Runtime::release(int slot) {
  SW_CHECK(slot >= 0 && static_cast<size_t>(slot) < buffers_.size(), "runtime: release of slot {} of {}", slot,
           buffers_.size());
  Tensor& t = buffers_[static_cast<size_t>(slot)];
  if (t.defined()) live_ -= static_cast<int64_t>(t.nbytes());
  t = Tensor();
}

void Runtime::set_buffers(std::vector<Tensor> buffers) {
  SW_CHECK(buffers.size() == p_.slots.size(), "runtime: {} buffers for {} slots", buffers.size(), p_.slots.size());
  buffers_ = std::move(buffers);
}

std::vector<Tensor> Runtime::take_buffers() {
  std::vector<Tensor> out = std::move(buffers_);
  buffers_.assign(p_.slots.size(), Tensor());
  return out;
}

int Runtime::value_slot(std::string_view name) const {
  int s = p_.value_slot[static_cast<size_t>(g_.get(name))];
  SW_CHECK(s >= 0, "value '{}' is never produced by the program", name);
  return s;
}

void Runtime::bind(int slot, Tensor t) {
  const graph::Slot& s = p_.slots[static_cast<size_t>(slot)];
  Shape want = mesh::local_shape(s.meta.shape, s.dist, p_.mesh, coords_);
  SW_CHECK(t.defined() && t.shape() == want && t.dtype() == s.meta.dtype,
           "'{}' on rank {} must be a {} block of shape {} (global {} under [{}]), got {} {}", s.name,
           mesh_comm_->rank_index(), dtype_name(s.meta.dtype), want.to_string(), s.meta.shape.to_string(),
           s.dist.to_string(), t.defined() ? dtype_name(t.dtype()) : "nothing", t.defined() ? t.shape().to_string() : "");
  buffers_[static_cast<size_t>(slot)] = std::move(t);
}

void Runtime::set_local(std::string_view name, const Tensor& local) {
  ValueId v = g_.get(name);
  SW_CHECK(g_.value(v).producer < 0, "'{}' is computed by the program; only inputs and parameters are set", name);
  bind(value_slot(name), local);
}

mesh::LocalBlock Runtime::local_block(std::string_view name) const {
  const graph::Slot& slot = p_.slots[static_cast<size_t>(value_slot(name))];
  return mesh::local_block(slot.meta.shape, slot.dist, p_.mesh, coords_);
}

void Runtime::set_global(std::string_view name, const Tensor& global) {
  int s = value_slot(name);
  const graph::Slot& slot = p_.slots[static_cast<size_t>(s)];
  SW_CHECK(global.shape() == slot.meta.shape && global.dtype() == slot.meta.dtype, "'{}' is {} {}, got {} {}", name,
           dtype_name(slot.meta.dtype), slot.meta.shape.to_string(), dtype_name(global.dtype()), global.shape().to_string());
  SW_CHECK(!slot.dist.has_partial(), "'{}' is annotated Partial [{}]: set its local part with set_local", name,
           slot.dist.to_string());
  mesh::LocalBlock b = mesh::local_block(slot.meta.shape, slot.dist, p_.mesh, coords_);
  set_local(name, global.slice(b.offsets(), b.shape));
}

void Runtime::keep(std::string_view name) { kept_[static_cast<size_t>(value_slot(name))] = true; }

ops::KernelContext Runtime::context(const std::vector<int>& slots) const {
  ops::KernelContext ctx;
  for (int s : slots) {
    if (s < 0) {
      ctx.tensors.emplace_back();
      continue;
    }
    const graph::Slot& slot = p_.slots[static_cast<size_t>(s)];
    mesh::LocalBlock b = mesh::local_block(slot.meta.shape, slot.dist, p_.mesh, coords_);
    ctx.tensors.push_back({slot.meta.shape, b.offset, slot.dist});
  }
  ctx.mesh_comm = mesh_comm_.get();
  ctx.sample_offset = sample_offset_;
  return ctx;
}

void Runtime::run() { run(0, order_.size()); }

void Runtime::run(size_t begin, size_t end) {
  SW_CHECK(begin <= end && end <= order_.size(), "runtime: run({}, {}) outside the {} instructions", begin, end,
           order_.size());
  stats_ = {};
  int64_t sent_before = resharder_.bytes_sent();
  int64_t gathered = 0;
  live_ = 0;
  auto held = [&](size_t s) { return buffers_[s].defined() ? static_cast<int64_t>(buffers_[s].nbytes()) : int64_t{0}; };
  for (size_t s = 0; s < buffers_.size(); ++s) {
    live_ += held(s);
    if (gathered_[s]) gathered += held(s);
  }
  stats_.peak_bytes = live_;
  stats_.peak_gathered_bytes = gathered;
  RankProfile* const profile = active_profile();  // null unless profiling (--profile)
  const std::vector<std::vector<size_t>>* prefetch = nullptr;
  if (options_.prefetch_params > 0) {
    auto [it, fresh] = prefetch_starts_.try_emplace({begin, end});
    if (fresh) it->second = graph::prefetch_starts(g_, p_, order_, begin, end, options_.prefetch_params);
    prefetch = &it->second;
  }
  started_.clear();
  const Device device = run_device(buffers_);
  std::optional<StreamScope> on_stream;
  if (!device.is_host()) {
    use_device(device);
    on_stream.emplace(streams_->compute);
  }
  for (size_t i = begin; i < end; ++i) {
    const graph::Instr& ins = p_.instrs[static_cast<size_t>(order_[i])];
    const int64_t started = profile ? profile->now_ns() : 0;
    if (prefetch) {  // the gathers starting here: their copies count from now
      for (size_t q : (*prefetch)[i]) {
        const graph::Instr& gather = p_.instrs[static_cast<size_t>(order_[q])];
        const Tensor& shard = buffers_[static_cast<size_t>(gather.in[0])];
        SW_CHECK(shard.defined(), "'{}' is not set: bind every input and parameter before run()",
                 p_.slots[static_cast<size_t>(gather.in[0])].name);
        // On a device the gather runs now on the communication stream; the compute stream waits for
        // it where it is used.
        Prefetched& r = started_[q];
        if (device.is_host()) r.host = resharder_.start(gather.plan, shard);
        else r = reshard_on_comm(resharder_, gather.plan, shard, device);
        live_ += r.nbytes();
        gathered += r.nbytes();
        ++stats_.prefetched;
      }
      stats_.peak_bytes = std::max(stats_.peak_bytes, live_);
      stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, gathered);
    }
    std::vector<Tensor> in;
    for (size_t k = 0; k < ins.in.size(); ++k) {
      int s = ins.in[k];
      const Tensor& t = buffers_[static_cast<size_t>(s)];
      if (!t.defined() && (!reads_value(ins, k) || unproduced_[static_cast<size_t>(s)])) {
        in.push_back(stand_in(s, device));  // released: the kernel reads its shape only
        continue;
      }
      SW_CHECK(t.defined(), "'{}' is not set: bind every input and parameter before run()",
               p_.slots[static_cast<size_t>(s)].name);
      in.push_back(t);
    }
    std::vector<Tensor> out;
    if (auto it = started_.find(i); it != started_.end()) {
      const int64_t bytes = it->second.nbytes();
      out.push_back(wait_on_compute(it->second));
      live_ -= bytes;  // counted at its start; counted again as it is stored below
      gathered -= bytes;
      started_.erase(it);
      ++stats_.reshards;
    } else if (ins.kind == InstrKind::Reshard) {
      out.push_back(reshard(ins.plan, in[0]));
      ++stats_.reshards;
    } else if (ins.kind == InstrKind::Fill) {
      const graph::Slot& s = p_.slots[static_cast<size_t>(ins.out[0])];
      Shape local = mesh::local_shape(s.meta.shape, s.dist, p_.mesh, coords_);
      const double value = g_.node(ins.node).attrs.get_float("value", 0.0);
      out.push_back(device.is_host() ? Tensor::full(s.meta.dtype, local, value)
                                     : ops::fill_on_device(s.meta.dtype, local, value, device));
    } else {
      const graph::Node& n = g_.node(ins.node);
      const ops::OpDef& def = ops::op_registry().get(n.op);
      ops::KernelContext ctx = context(ins.in);
      try {
        if (ins.kind == InstrKind::Kernel) {
          out = ops::run_forward(def, in, n.attrs, &ctx);
        } else {
          size_t nin = g_.node(n.forward).inputs.size(), nout = g_.node(n.forward).outputs.size();
          std::span<const Tensor> all(in);
          // Only the gradients the node names (a split node computes its share only).
          std::unique_ptr<bool[]> wanted(new bool[ins.out.size()]);
          bool all_wanted = true;
          for (size_t k = 0; k < ins.out.size(); ++k) {
            wanted[k] = ins.out[k] >= 0;
            all_wanted = all_wanted && wanted[k];
          }
          out = ops::run_backward(def, all.subspan(0, nin), all.subspan(nin, nout), all.subspan(nin + nout), n.attrs, &ctx,
                                  all_wanted ? std::span<const bool>() : std::span<const bool>(wanted.get(), ins.out.size()));
        }
      } catch (const Error& e) {
        fail("node {} on rank {}: {}", n.to_string(g_), mesh_comm_->rank_index(), e.what());
      }
      ++stats_.kernels;
    }
    for (size_t k = 0; k < ins.out.size(); ++k) {
      int s = ins.out[k];
      if (s < 0 || k >= out.size()) continue;
      const int64_t before = held(static_cast<size_t>(s));
      buffers_[static_cast<size_t>(s)] = out[k];
      live_ += held(static_cast<size_t>(s)) - before;
      if (gathered_[static_cast<size_t>(s)]) gathered += held(static_cast<size_t>(s)) - before;
    }
    if (profile) {
      // On a device the launches return before the work is done: the host waits for both streams,
      // so an instruction's time is its kernels' and collectives' (profiling serialises them).
      if (!device.is_host()) {
        device_memory(device).synchronize(streams_->compute);
        device_memory(device).synchronize(streams_->comm);
      }
      record_instr(*profile, i, ins, in, out, started);
    }
    stats_.peak_bytes = std::max(stats_.peak_bytes, live_);
    stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, gathered);
    for (int s : ins.in) {
      auto si = static_cast<size_t>(s);
      if (s >= 0 && last_use_[si] == static_cast<int>(i) && !kept_[si] && buffers_[si].defined()) {
        live_ -= static_cast<int64_t>(buffers_[si].nbytes());
        if (gathered_[si]) gathered -= static_cast<int64_t>(buffers_[si].nbytes());
        buffers_[si] = Tensor();
      }
    }
    // Outputs nobody reads (an op's auxiliary outputs) go at once.
    for (int s : ins.out) {
      if (s >= 0 && last_use_[static_cast<size_t>(s)] < 0 && !kept_[static_cast<size_t>(s)] && buffers_[static_cast<size_t>(s)].defined()) {
        live_ -= static_cast<int64_t>(buffers_[static_cast<size_t>(s)].nbytes());
        buffers_[static_cast<size_t>(s)] = Tensor();
      }
    }
    if (after_instr_) after_instr_(i);
  }
  stats_.bytes_sent = resharder_.bytes_sent() - sent_before;
}

void Runtime::record_instr(RankProfile& profile, size_t pos, const graph::Instr& ins, const std::vector<Tensor>& in,
                           const std::vector<Tensor>& out, int64_t started) {
  ProfileEvent e;
  e.start_ns = started;
  e.dur_ns = profile.now_ns() - started;
  for (const Tensor& t : out) e.bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  e.kind = ins.kind == InstrKind::Reshard ? EventKind::Reshard : ins.kind == InstrKind::Fill ? EventKind::Fill : EventKind::Op;
  // The name and the text of an instruction are the same every run: made and interned once per profile.
  if (profile_of_text_ != profile.serial()) profile_text_.assign(order_.size(), {-1, -1}), profile_of_text_ = profile.serial();
  auto& [name, detail] = profile_text_[pos];
  if (name < 0 && ins.kind == InstrKind::Reshard) {
    const graph::Slot& from = p_.slots[static_cast<size_t>(ins.in[0])];
    name = profile.intern("reshard");
    detail = profile.intern(fmt::format("{} [{}] -> [{}]", from.name, from.dist.to_string(),
                                        p_.slots[static_cast<size_t>(ins.out[0])].dist.to_string()));
  } else if (name < 0) {
    const graph::Node& n = g_.node(ins.node);
    name = profile.intern(ins.kind == InstrKind::Backward ? n.op + "_grad" : n.op);
    std::string shapes;
    for (const Tensor& t : in) shapes += (shapes.empty() ? "" : " ") + (t.defined() ? t.shape().to_string() : "_");
    detail = profile.intern(fmt::format("{}: {}", n.to_string(g_), shapes));
  }
  e.name = name;
  e.detail = detail;
  profile.record(e);
}

Tensor Runtime::local(std::string_view name) const {
  int s = p_.value_slot[static_cast<size_t>(g_.get(name))];
  SW_CHECK(s >= 0 && buffers_[static_cast<size_t>(s)].defined(),
           "'{}' is not held after run(): ask Runtime::keep(\"{}\") before running", name, name);
  return buffers_[static_cast<size_t>(s)];
}

int Runtime::grad_slot(std::string_view param) const {
  ValueId v = g_.get(param);
  auto params = g_.params();
  auto it = std::find(params.begin(), params.end(), v);
  SW_CHECK(it != params.end(), "'{}' is not a parameter", param);
  int s = p_.param_grad_slot[static_cast<size_t>(it - params.begin())];
  SW_CHECK(s >= 0 && buffers_[static_cast<size_t>(s)].defined(), "parameter '{}' has no gradient", param);
  return s;
}

Tensor Runtime::local_grad(std::string_view param) const { return buffers_[static_cast<size_t>(grad_slot(param))]; }

Tensor Runtime::gather_slot(int s) {
  const graph::Slot& slot = p_.slots[static_cast<size_t>(s)];
  reshard::Plan plan = reshard::plan_reshard(slot.meta.shape, slot.meta.dtype, {p_.mesh, slot.dist},
                                             {p_.mesh, mesh::DistAttr(p_.mesh.ndim())});
  return reshard(plan, buffers_[static_cast<size_t>(s)]);
}

Tensor Runtime::gather(std::string_view name) {
  local(name);  // the Error when it is gone
  return gather_slot(p_.value_slot[static_cast<size_t>(g_.get(name))]);
}

Tensor Runtime::gather_grad(std::string_view param) { return gather_slot(grad_slot(param)); }

}  // namespace shardwise::runtime
