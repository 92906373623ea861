#include "shardwise/comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <utility>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::comm {

Reduce to_reduce(mesh::ReduceOp op) {
  switch (op) {
    case mesh::ReduceOp::Sum: return Reduce::Sum;
    case mesh::ReduceOp::Avg: return Reduce::Avg;
    case mesh::ReduceOp::Max: return Reduce::Max;
    case mesh::ReduceOp::Min: return Reduce::Min;
  }
  return Reduce::Sum;
}

std::string_view reduce_name(Reduce op) {
  switch (op) {
    case Reduce::Sum: return "sum";
    case Reduce::Avg: return "avg";
    case Reduce::Max: return "max";
    case Reduce::Min: return "min";
    case Reduce::Prod: return "prod";
  }
  return "?";
}

void Communicator::all_reduce(const Tensor& in, Tensor& out, Reduce op) {
  SW_CHECK(in.dtype() == out.dtype() && in.shape() == out.shape(),
           "all_reduce: input {} {} and output {} {} differ", dtype_name(in.dtype()), in.shape().to_string(),
           dtype_name(out.dtype()), out.shape().to_string());
  all_reduce(in.raw(), out.raw(), in.numel(), in.dtype(), op);
}

namespace {

// Completes at wait(), by making the blocking call then (once), on the buffers' memory of its start
// (comm/device_buffers.h: a DeviceBuffers scope of the start holds at the wait too).
class DeferredRequest final : public Request {
 public:
  explicit DeferredRequest(std::function<void()> call) : call_(std::move(call)) {
    if (const DeviceBuffers* d = DeviceBuffers::current()) [[unlikely]] device_ = {d->device, d->stream};
  }
  // One never waited for (a step unwinding from an error) never makes its call: nothing started.
  void wait() override {
    if (!call_) return;
    auto call = std::move(call_);
    call_ = nullptr;
    if (!device_) [[likely]] return call();
    DeviceBuffers scope(device_->first, device_->second);
    call();
  }
  bool test() override { return !call_; }

 private:
  std::function<void()> call_;
  std::optional<std::pair<Device, Stream>> device_;
};

}  // namespace

std::unique_ptr<Request> Communicator::start_all_reduce(const void* in, void* out, int64_t count, DType dtype,
                                                        Reduce op) {
  return std::make_unique<DeferredRequest>([=, this] { all_reduce(in, out, count, dtype, op); });
}

std::unique_ptr<Request> Communicator::start_reduce_scatter_v(const void* in, void* out,
                                                              std::span<const int64_t> counts, DType dtype, Reduce op) {
  check_counts("reduce_scatter_v", counts);
  std::vector<int64_t> copy(counts.begin(), counts.end());
  return std::make_unique<DeferredRequest>(
      [=, this, copy = std::move(copy)] { reduce_scatter_v(in, out, copy, dtype, op); });
}

std::unique_ptr<Request> Communicator::start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                          DType dtype) {
  check_counts("all_gather_v", counts);
  std::vector<int64_t> copy(counts.begin(), counts.end());
  return std::make_unique<DeferredRequest>([=, this, copy = std::move(copy)] { all_gather_v(in, out, copy, dtype); });
}

std::unique_ptr<Request> Communicator::start_send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  check_peer("send", peer);
  SW_CHECK(count >= 0, "send: negative count {}", count);
  return std::make_unique<DeferredRequest>([=, this] { send(in, count, dtype, peer, tag); });
}

std::unique_ptr<Request> Communicator::start_recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  check_peer("recv", peer);
  SW_CHECK(count >= 0, "recv: negative count {}", count);
  return std::make_unique<DeferredRequest>([=, this] { recv(out, count, dtype, peer, tag); });
}

namespace {
// This thread's CheckedByCaller scopes, innermost last.
thread_local std::vector<const Communicator*> checked_by_caller;
}  // namespace

CheckedByCaller::CheckedByCaller(const Communicator* group) : group_(group ? group->carrier() : nullptr) {
  if (group_) checked_by_caller.push_back(group_);
}

CheckedByCaller::~CheckedByCaller() {
  if (group_) checked_by_caller.pop_back();
}

bool CheckedByCaller::active(const Communicator* group) {
  return group && std::find(checked_by_caller.begin(), checked_by_caller.end(), group->carrier()) != checked_by_caller.end();
}

int64_t Pieces::total(size_t rank) const {
  int64_t s = 0;
  for (auto i = static_cast<size_t>(first[rank]); i < static_cast<size_t>(first[rank + 1]); ++i) s += count[i];
  return s;
}

std::vector<int64_t> Communicator::check_pieces(const char* op, const Pieces& p) const {
  SW_CHECK(static_cast<int>(p.first.size()) == size() + 1 && p.first[0] == 0,
           "{}: {} piece starts given for a group of {} ranks (want {}, the first 0)", op, p.first.size(), size(),
           size() + 1);
  for (size_t r = 0; r < static_cast<size_t>(size()); ++r) {
    SW_CHECK(p.first[r + 1] >= p.first[r], "{}: the pieces of rank {} end before they start", op, r);
  }
  const auto n = static_cast<size_t>(p.first.back());
  SW_CHECK(p.offset.size() == n && p.count.size() == n, "{}: {} pieces named but {} offsets and {} counts given", op, n,
           p.offset.size(), p.count.size());
  std::vector<int64_t> totals(static_cast<size_t>(size()), 0);
  for (size_t r = 0; r < totals.size(); ++r) {
    for (auto i = static_cast<size_t>(p.first[r]); i < static_cast<size_t>(p.first[r + 1]); ++i) {
      SW_CHECK(p.count[i] >= 0 && p.offset[i] >= 0, "{}: piece {} of rank {} has offset {} and count {} (both must be >= 0)",
               op, i, r, p.offset[i], p.count[i]);
    }
    totals[r] = p.total(r);
  }
  return totals;
}

// A forwarding wrapper's carrier makes the calls (the wrapper holds it, so the cast is to an
// object the caller may change through the wrapper anyway); any other backend shares nothing.
SharedRegions Communicator::shared_regions(int64_t bytes) {
  SW_CHECK(bytes >= 0, "shared_regions: negative size {}", bytes);
  if (carrier() != this) return const_cast<Communicator*>(carrier())->shared_regions(bytes);
  return {};
}

void Communicator::shared_barrier() {
  SW_CHECK(carrier() != this, "shared_barrier: the {} backend has no shared regions", backend());
  const_cast<Communicator*>(carrier())->shared_barrier();
}

void Communicator::shared_exchange(int64_t bytes, const FillPieces& fill) {
  SW_CHECK(bytes >= 0, "shared_exchange: negative size {}", bytes);
  fill_every_peer(*this, fill);
  shared_barrier();
}

void fill_every_peer(const Communicator& c, const FillPieces& fill) {
  if (!fill) return;
  for (int step = 1; step <= c.size(); ++step) fill((c.rank() + step) % c.size());
}

void Communicator::all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                                     const FillPieces& fill) {
  const std::vector<int64_t> sc = check_pieces("all_to_all_pieces (send)", send);
  const std::vector<int64_t> rc = check_pieces("all_to_all_pieces (receive)", recv);
  fill_every_peer(*this, fill);
  const size_t es = dtype_size(dtype);
  // Device buffers (a DeviceBuffers scope): packed and unpacked by the device's copies on the
  // scope's stream, through device scratch.
  const DeviceBuffers* device = DeviceBuffers::current();
  auto gather = [es, device](const std::byte* from, const Pieces& p, std::byte* to, bool into_pieces) {
    size_t at = 0;
    for (size_t i = 0; i < p.offset.size(); ++i) {
      const size_t b = static_cast<size_t>(p.count[i]) * es, o = static_cast<size_t>(p.offset[i]) * es;
      std::byte* dst = into_pieces ? to + o : to + at;
      const std::byte* src = into_pieces ? from + at : from + o;
      if (b && device) device_memory(device->device).copy_on_device(dst, src, b, device->stream);
      else if (b) std::memcpy(dst, src, b);
      at += b;
    }
  };
  auto scratch = [device, es](const std::vector<int64_t>& counts, std::vector<std::byte>& host, Tensor& on_device) {
    const auto bytes = static_cast<int64_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0}) * static_cast<int64_t>(es));
    if (!device) {
      host.resize(static_cast<size_t>(bytes));
      return host.data();
    }
    on_device = empty_on(DType::U8, Shape{bytes}, device->device, device->stream);
    return static_cast<std::byte*>(on_device.device_ptr());
  };
  std::vector<std::byte> packed_host, got_host;
  Tensor packed_device, got_device;
  std::byte* packed = scratch(sc, packed_host, packed_device);
  std::byte* got = scratch(rc, got_host, got_device);
  gather(static_cast<const std::byte*>(in), send, packed, false);
  all_to_all_v(packed, sc, got, rc, dtype);
  gather(got, recv, static_cast<std::byte*>(out), true);
}

void Communicator::check_root(const char* op, int root) const {
  SW_CHECK(root >= 0 && root < size(), "{}: root {} is not a rank of a group of {}", op, root, size());
}

void Communicator::check_peer(const char* op, int peer) const {
  SW_CHECK(peer >= 0 && peer < size(), "{}: peer {} is not a rank of a group of {}", op, peer, size());
  SW_CHECK(peer != rank(), "{}: rank {} names itself as its peer", op, rank());
}

void Communicator::check_counts(const char* op, std::span<const int64_t> counts) const {
  SW_CHECK(static_cast<int>(counts.size()) == size(), "{}: {} counts given for a group of {} ranks", op,
           counts.size(), size());
  for (size_t r = 0; r < counts.size(); ++r) {
    SW_CHECK(counts[r] >= 0, "{}: negative count {} for rank {}", op, counts[r], r);
  }
}

int Communicator::group_index(std::span<const int> global_ranks) const {
  const std::vector<int>& parent = members();
  int me = parent[static_cast<size_t>(rank())];
  int index = -1;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    SW_CHECK(std::count(parent.begin(), parent.end(), global_ranks[i]) == 1,
             "group: rank {} is not a member of the parent group", global_ranks[i]);
    SW_CHECK(std::count(global_ranks.begin(), global_ranks.end(), global_ranks[i]) == 1, "group: rank {} is listed twice",
             global_ranks[i]);
    if (global_ranks[i] == me) index = static_cast<int>(i);
  }
  SW_CHECK(index >= 0, "group: rank {} asked for a group it is not in", me);
  return index;
}

std::vector<std::byte> Communicator::broadcast_bytes(std::span<const std::byte> bytes, int root) {
  check_root("broadcast_bytes", root);
  int64_t n = rank() == root ? static_cast<int64_t>(bytes.size()) : 0;
  broadcast(&n, 1, DType::I64, root);
  std::vector<std::byte> out(static_cast<size_t>(n));
  if (rank() == root && n) std::copy(bytes.begin(), bytes.end(), out.begin());
  broadcast(out.data(), n, DType::U8, root);
  return out;
}

std::vector<std::vector<std::byte>> Communicator::all_gather_bytes(std::span<const std::byte> bytes) {
  int64_t mine = static_cast<int64_t>(bytes.size());
  std::vector<int64_t> counts(static_cast<size_t>(size()));
  all_gather(&mine, counts.data(), 1, DType::I64);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<std::byte> packed(static_cast<size_t>(total));
  all_gather_v(bytes.data(), packed.data(), counts, DType::U8);
  std::vector<std::vector<std::byte>> out;
  int64_t at = 0;
  for (int64_t c : counts) {
    out.emplace_back(packed.begin() + at, packed.begin() + at + c);
    at += c;
  }
  return out;
}

MeshComm::MeshComm(mesh::ProcessMesh mesh, std::shared_ptr<Communicator> world)
    : mesh_(std::move(mesh)), world_(std::move(world)) {
  int me = world_->members()[static_cast<size_t>(world_->rank())];
  SW_CHECK(mesh_.contains(me), "rank {} is not a process of mesh {} (processes {})", me, mesh_.to_string(),
           fmt::join(mesh_.process_ids(), ","));
  rank_index_ = mesh_.rank_index_of_process(me);
}

Communicator& MeshComm::along(std::span<const int> mesh_dims) {
  uint32_t key = 0;
  for (int m : mesh_dims) {
    SW_CHECK(m >= 0 && m < mesh_.ndim(), "mesh {} has no dim {}", mesh_.to_string(), m);
    key = key * 16 + static_cast<uint32_t>(m) + 1;
  }
  for (auto& [k, g] : groups_) {
    if (k == key) return *g;
  }
  // Members: vary the listed mesh dims (first listed = most significant), keep the others.
  std::vector<int> members;
  for (int64_t p : mesh_.processes_along(mesh_.process_ids()[static_cast<size_t>(rank_index_)], mesh_dims))
    members.push_back(static_cast<int>(p));
  groups_.emplace_back(key, world_->group(members));
  return *groups_.back().second;
}

}  // namespace shardwise::comm
