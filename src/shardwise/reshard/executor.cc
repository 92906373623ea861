#include "shardwise/reshard/executor.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/reshard/blocks.h"
#include "shardwise/reshard/device_blocks.h"
#include "shardwise/tensor/current_stream.h"

namespace shardwise::reshard {
namespace {

std::vector<int64_t> relative(const Box& inner, const Box& outer) {
  std::vector<int64_t> off(static_cast<size_t>(inner.shape.ndim()));
  for (size_t d = 0; d < off.size(); ++d) off[d] = inner.offset[d] - outer.offset[d];
  return off;
}

// The part `inner` (global coordinates) of a tensor holding the box `outer`.
Tensor cut(const Tensor& t, const Box& outer, const Box& inner) {
  if (inner.shape == outer.shape && relative(inner, outer) == std::vector<int64_t>(relative(inner, outer).size(), 0))
    return t;
  return t.slice(relative(inner, outer), inner.shape);
}

void put(Tensor& t, const Box& outer, const Tensor& piece, const Box& inner) {
  if (inner.numel() == 0) return;
  t.paste(piece, relative(inner, outer));
}

// Concatenates the raw bytes of `pieces`.
Tensor pack(const std::vector<Tensor>& pieces, DType dtype) {
  int64_t n = 0;
  for (const Tensor& p : pieces) n += p.numel();
  Tensor out(dtype, Shape{n});
  size_t at = 0;
  for (const Tensor& p : pieces) {
    if (p.nbytes()) std::memcpy(out.raw() + at, p.raw(), p.nbytes());
    at += p.nbytes();
  }
  return out;
}

Tensor view(const Tensor& packed, int64_t first, const Shape& shape) {
  Tensor out(packed.dtype(), shape);
  if (out.nbytes()) std::memcpy(out.raw(), packed.raw() + first * static_cast<int64_t>(dtype_size(packed.dtype())), out.nbytes());
  return out;
}

// Where a run's blocks are: the device of this thread's DeviceBuffers scope, else the host.
Device blocks_device() {
  const comm::DeviceBuffers* d = comm::DeviceBuffers::current();
  return d ? d->device : Device::host();
}

// A new block where the run's blocks are (zero-filled when `zeroed`; on the host always).
Tensor make(DType dtype, const Shape& shape, bool zeroed) {
  const Device device = blocks_device();
  if (device.is_host()) [[likely]] return Tensor(dtype, shape);
  return zeroed ? device_blocks::zeros(dtype, shape, device) : device_blocks::empty(dtype, shape, device);
}

// Writes the elements from `first` of `packed` (the box `inner`) into `out`, which holds `outer`.
void unpack(Tensor& out, const Box& outer, const Tensor& packed, int64_t first, const Box& inner) {
  if (!out.on_device()) [[likely]] return put(out, outer, view(packed, first, inner.shape), inner);
  device_blocks::put(out, outer, packed, inner, first);
}

// A tensor's bytes for a collective: host memory, or device memory (under the run's DeviceBuffers
// scope).
void* bytes_of(Tensor& t) { return t.on_device() ? t.device_ptr() : t.raw(); }

std::vector<int64_t> with_coord(std::span<const int64_t> coords, int m, int64_t v) {
  std::vector<int64_t> c(coords.begin(), coords.end());
  c[static_cast<size_t>(m)] = v;
  return c;
}

}  // namespace

Resharder::Resharder(std::shared_ptr<comm::Communicator> world) : world_(std::move(world)) {
  me_ = world_->members()[static_cast<size_t>(world_->rank())];
}

comm::Communicator& Resharder::group(const mesh::ProcessMesh& mesh, std::span<const int64_t> coords,
                                     std::span<const int> dims) {
  Layout l{mesh, mesh::DistAttr(mesh.ndim())};
  std::vector<int> members;
  for (const Holder& h : holders(Shape{}, l, coords, dims)) members.push_back(static_cast<int>(h.process));
  auto& g = groups_[members];
  if (!g) g = world_->group(members);
  return *g;
}

Tensor Resharder::run(const Plan& plan, const Tensor& local) {
  const Device device = blocks_device();
  SW_CHECK(!local.defined() || local.device() == device,
           "reshard: rank {} passes a block on {} to a reshard of blocks on {} (a comm::DeviceBuffers scope says "
           "where the blocks are)",
           me_, local.defined() ? local.device().to_string() : "", device.to_string());
  Tensor t;
  if (plan.from.mesh.contains(me_)) {
    auto coords = plan.from.mesh.coords(plan.from.mesh.rank_index_of_process(me_));
    Box mine = block_at(plan.shape, plan.from, coords);
    SW_CHECK(local.defined() && local.shape() == mine.shape && local.dtype() == plan.dtype,
             "reshard: rank {} holds {} {} but its block of {} {} under {} is {} {}", me_,
             local.defined() ? dtype_name(local.dtype()) : "nothing",
             local.defined() ? local.shape().to_string() : "", dtype_name(plan.dtype), plan.shape.to_string(),
             plan.from.to_string(), dtype_name(plan.dtype), mine.shape.to_string());
    t = local;
  }
  for (const Step& step : plan.steps) {
    if (step.kind == StepKind::SendRecv) {
      t = send_recv(step, plan, t);
    } else if (step.before.mesh.contains(me_)) {
      t = run_step(step, plan, t);
    }
  }
  return plan.to.mesh.contains(me_) ? t : Tensor();
}

Tensor Resharder::run_step(const Step& step, const Plan& plan, Tensor t) {
  const mesh::ProcessMesh& mesh = step.before.mesh;
  auto coords = mesh.coords(mesh.rank_index_of_process(me_));
  const int m = step.mesh_dim;
  const DType dtype = plan.dtype;
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const bool host = blocks_device().is_host();
  Box before = block_at(plan.shape, step.before, coords), after = block_at(plan.shape, step.after, coords);
  switch (step.kind) {
    case StepKind::AllReduce: {
      comm::Communicator& g = group(mesh, coords, std::span<const int>(&m, 1));
      Tensor out = make(dtype, t.shape(), false);
      g.all_reduce(bytes_of(t), bytes_of(out), t.numel(), dtype, comm::to_reduce(step.op));
      bytes_sent_ += 2 * (g.size() - 1) * t.numel() * elem / g.size();
      return out;
    }
    case StepKind::ReduceScatter: {
      comm::Communicator& g = group(mesh, coords, std::span<const int>(&m, 1));
      std::vector<Tensor> pieces;
      std::vector<Box> boxes;
      std::vector<int64_t> counts;
      for (int64_t p = 0; p < mesh.dim_size(m); ++p) {
        Box b = block_at(plan.shape, step.after, with_coord(coords, m, p));
        if (host) [[likely]] pieces.push_back(cut(t, before, b));
        boxes.push_back(b);
        counts.push_back(b.numel());
      }
      Tensor packed = host ? pack(pieces, dtype) : device_blocks::pack(t, before, boxes);
      Tensor out = make(dtype, after.shape, false);
      g.reduce_scatter_v(bytes_of(packed), bytes_of(out), counts, dtype, comm::to_reduce(step.op));
      bytes_sent_ += (packed.numel() - out.numel()) * elem;
      return out;
    }
    case StepKind::AllGather: {
      comm::Communicator& g = group(mesh, coords, std::span<const int>(&m, 1));
      std::vector<Box> boxes;
      std::vector<int64_t> counts;
      int64_t total = 0;
      for (int64_t p = 0; p < mesh.dim_size(m); ++p) {
        boxes.push_back(block_at(plan.shape, step.before, with_coord(coords, m, p)));
        counts.push_back(boxes.back().numel());
        total += counts.back();
      }
      Tensor packed = make(dtype, Shape{total}, false), out = make(dtype, after.shape, true);
      g.all_gather_v(bytes_of(t), bytes_of(packed), counts, dtype);
      int64_t at = 0;
      for (size_t p = 0; p < boxes.size(); ++p) {
        unpack(out, after, packed, at, boxes[p]);
        at += counts[p];
      }
      bytes_sent_ += (g.size() - 1) * t.numel() * elem;
      return out;
    }
    case StepKind::AllToAll: return exchange(step, plan, t, std::span<const int>(&m, 1));
    case StepKind::Redistribute: return exchange(step, plan, t, step.group_dims);
    case StepKind::LocalSlice: return host ? cut(t, before, after) : device_blocks::cut(t, before, after);
    case StepKind::Partialize:
      if (step.op == mesh::ReduceOp::Sum && coords[static_cast<size_t>(m)] != 0) return make(dtype, t.shape(), true);
      return t;
    case StepKind::SendRecv: break;
  }
  fail("internal: unexpected reshard step {}", step_kind_name(step.kind));
}

bool Resharder::can_start(const Plan& plan) const {
  return plan.steps.size() == 1 && plan.steps[0].kind == StepKind::AllGather && plan.from.mesh.contains(me_) &&
         plan.to.mesh.contains(me_);
}

std::unique_ptr<StartedReshard> Resharder::start(const Plan& plan, const Tensor& local) {
  SW_CHECK(can_start(plan), "internal: reshard::start of a plan that is not one all-gather ({})", plan.to_string());
  SW_CHECK(blocks_device().is_host() && !local.on_device(),
           "reshard: a started reshard of device blocks (a device run's gathers run at their position)");
  const Step& step = plan.steps[0];
  const mesh::ProcessMesh& mesh = step.before.mesh;
  auto coords = mesh.coords(mesh.rank_index_of_process(me_));
  const int m = step.mesh_dim;
  auto started = std::make_unique<StartedReshard>();
  started->after_ = block_at(plan.shape, step.after, coords);
  Box mine = block_at(plan.shape, step.before, coords);
  SW_CHECK(local.defined() && local.shape() == mine.shape && local.dtype() == plan.dtype,
           "reshard: rank {} holds {} but its block under {} is {} {}", me_,
           local.defined() ? local.shape().to_string() : "nothing", plan.from.to_string(), dtype_name(plan.dtype),
           mine.shape.to_string());
  comm::Communicator& g = group(mesh, coords, std::span<const int>(&m, 1));
  std::vector<int64_t> counts;
  int64_t total = 0;
  bool rows_in_order = true;  // piece p = the next rows of the output
  int64_t next_row = started->after_.offset[0];
  for (int64_t p = 0; p < mesh.dim_size(m); ++p) {
    Box b = block_at(plan.shape, step.before, with_coord(coords, m, p));
    counts.push_back(b.numel());
    total += b.numel();
    if (b.numel() > 0) {
      rows_in_order = rows_in_order && b.offset[0] == next_row;
      for (int d = 1; d < b.shape.ndim(); ++d)
        rows_in_order = rows_in_order && b.offset[static_cast<size_t>(d)] == started->after_.offset[static_cast<size_t>(d)] &&
                        b.shape[d] == started->after_.shape[d];
      next_row += b.shape[0];
    }
    started->boxes_.push_back(b);
  }
  started->out_ = Tensor::uninitialized(plan.dtype, started->after_.shape);
  void* into = started->out_.raw();
  if (!rows_in_order || total != started->out_.numel()) {
    started->packed_ = Tensor::uninitialized(plan.dtype, Shape{total});
    into = started->packed_.raw();
  }
  started->request_ = g.start_all_gather_v(local.raw(), into, counts, plan.dtype);
  bytes_sent_ += (g.size() - 1) * local.numel() * static_cast<int64_t>(dtype_size(plan.dtype));
  return started;
}

Tensor StartedReshard::wait() {
  request_->wait();
  if (packed_.defined()) {
    int64_t at = 0;
    for (const Box& b : boxes_) {
      put(out_, after_, view(packed_, at, b.shape), b);
      at += b.numel();
    }
    packed_ = Tensor();
  }
  return out_;
}

Tensor Resharder::exchange(const Step& step, const Plan& plan, const Tensor& t, std::span<const int> dims) {
  const mesh::ProcessMesh& mesh = step.before.mesh;
  auto coords = mesh.coords(mesh.rank_index_of_process(me_));
  comm::Communicator& g = group(mesh, coords, dims);
  const bool host = blocks_device().is_host();
  auto src = holders(plan.shape, step.before, coords, dims), dst = holders(plan.shape, step.after, coords, dims);
  std::vector<Transfer> transfers = plan_transfers(src, dst);
  Box before = block_at(plan.shape, step.before, coords), after = block_at(plan.shape, step.after, coords);
  const auto n = static_cast<size_t>(g.size());
  std::vector<int64_t> send(n, 0), recv(n, 0);
  std::vector<Tensor> pieces(n);
  std::vector<const Transfer*> incoming(n, nullptr), outgoing(n, nullptr);
  auto index_of = [&](int64_t process) {
    for (size_t i = 0; i < n; ++i) {
      if (src[i].process == process) return i;
    }
    fail("internal: process {} is not in the exchange group", process);
  };
  for (const Transfer& tr : transfers) {
    if (tr.src == me_) {
      size_t p = index_of(tr.dst);
      if (host) [[likely]] pieces[p] = cut(t, before, tr.box);
      else outgoing[p] = &tr;
      send[p] = tr.box.numel();
      if (tr.dst != me_) bytes_sent_ += send[p] * static_cast<int64_t>(dtype_size(plan.dtype));
    }
    if (tr.dst == me_) {
      size_t p = index_of(tr.src);
      incoming[p] = &tr;
      recv[p] = tr.box.numel();
    }
  }
  Tensor packed;
  if (host) [[likely]] {
    std::vector<Tensor> nonempty;
    for (auto& piece : pieces) {
      if (piece.defined()) nonempty.push_back(piece);
    }
    packed = pack(nonempty, plan.dtype);
  } else {
    std::vector<Box> boxes;
    for (const Transfer* tr : outgoing) {
      if (tr) boxes.push_back(tr->box);
    }
    packed = device_blocks::pack(t, before, boxes);
  }
  int64_t total = 0;
  for (int64_t c : recv) total += c;
  Tensor received = make(plan.dtype, Shape{total}, false), out = make(plan.dtype, after.shape, true);
  g.all_to_all_v(bytes_of(packed), send, bytes_of(received), recv, plan.dtype);
  int64_t at = 0;
  for (size_t p = 0; p < n; ++p) {
    if (!incoming[p]) continue;
    unpack(out, after, received, at, incoming[p]->box);
    at += recv[p];
  }
  return out;
}

Tensor Resharder::send_recv(const Step& step, const Plan& plan, const Tensor& t) {
  const Layout &from = step.before, &to = step.after;
  bool in_from = from.mesh.contains(me_), in_to = to.mesh.contains(me_);
  const bool host = blocks_device().is_host();
  if (!in_from && !in_to) return Tensor();
  std::vector<Transfer> transfers;
  if (from.dist == to.dist && from.mesh.shape() == to.mesh.shape()) {
    // Same placements on a mesh of the same shape: rank i's part (Partial or not) goes to rank i.
    for (int64_t i = 0; i < from.mesh.size(); ++i) {
      Box b = block_at(plan.shape, from, from.mesh.coords(i));
      transfers.push_back({from.mesh.process_ids()[static_cast<size_t>(i)], to.mesh.process_ids()[static_cast<size_t>(i)], b});
    }
  } else {
    std::vector<int> all_from(static_cast<size_t>(from.mesh.ndim())), all_to(static_cast<size_t>(to.mesh.ndim()));
    for (size_t i = 0; i < all_from.size(); ++i) all_from[i] = static_cast<int>(i);
    for (size_t i = 0; i < all_to.size(); ++i) all_to[i] = static_cast<int>(i);
    std::vector<int64_t> zf(all_from.size(), 0), zt(all_to.size(), 0);
    transfers = plan_transfers(holders(plan.shape, from, zf, all_from), holders(plan.shape, to, zt, all_to));
  }
  // One global order of messages (by the pair, then the sender) that every process follows:
  // blocking sends cannot deadlock, whatever the protocol.
  std::sort(transfers.begin(), transfers.end(), [](const Transfer& a, const Transfer& b) {
    auto key = [](const Transfer& x) {
      return std::make_tuple(std::min(x.src, x.dst), std::max(x.src, x.dst), x.src);
    };
    return key(a) < key(b);
  });
  Box mine_from, mine_to;
  if (in_from) mine_from = block_at(plan.shape, from, from.mesh.coords(from.mesh.rank_index_of_process(me_)));
  Tensor out;
  if (in_to) {
    mine_to = block_at(plan.shape, to, to.mesh.coords(to.mesh.rank_index_of_process(me_)));
    out = make(plan.dtype, mine_to.shape, true);
  }
  auto peer = [&](int64_t process) {
    const auto& m = world_->members();
    auto it = std::find(m.begin(), m.end(), static_cast<int>(process));
    SW_CHECK(it != m.end(), "reshard: process {} of the plan is not in the communicator", process);
    return static_cast<int>(it - m.begin());
  };
  for (const Transfer& tr : transfers) {
    if (tr.src == me_ && tr.dst == me_) {
      if (host) put(out, mine_to, cut(t, mine_from, tr.box), tr.box);
      else device_blocks::put(out, mine_to, device_blocks::cut(t, mine_from, tr.box), tr.box);
    } else if (tr.src == me_) {
      Tensor piece = host ? cut(t, mine_from, tr.box) : device_blocks::cut(t, mine_from, tr.box);
      world_->send(bytes_of(piece), piece.numel(), plan.dtype, peer(tr.dst), 0);
      bytes_sent_ += static_cast<int64_t>(piece.nbytes());
    } else if (tr.dst == me_) {
      Tensor piece = make(plan.dtype, tr.box.shape, false);
      world_->recv(bytes_of(piece), piece.numel(), plan.dtype, peer(tr.src), 0);
      unpack(out, mine_to, piece, 0, tr.box);
    }
  }
  return out;
}

}  // namespace shardwise::reshard
