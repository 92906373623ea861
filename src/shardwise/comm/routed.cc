#include "shardwise/comm/routed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "shardwise/comm/device_buffers.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

namespace {
std::string side_text(const Communicator& c) {
  return fmt::format("{} (size {}, rank {}, members [{}])", c.backend(), c.size(), c.rank(),
                     fmt::join(c.members(), ","));
}
}  // namespace

RoutedComm::RoutedComm(std::shared_ptr<Communicator> host, std::shared_ptr<Communicator> device)
    : RoutedComm(std::move(host), std::move(device), std::make_shared<Routes>()) {}

RoutedComm::RoutedComm(std::shared_ptr<Communicator> host, std::shared_ptr<Communicator> device,
                       std::shared_ptr<Routes> routes)
    : host_(std::move(host)), device_(std::move(device)), routes_(std::move(routes)) {
  SW_CHECK(host_ && device_, "routed communicator: the {} side is missing", host_ ? "device" : "host");
  SW_CHECK(host_->size() == device_->size() && host_->rank() == device_->rank() && host_->members() == device_->members(),
           "routed communicator: the host side {} and the device side {} are not the same group of ranks",
           side_text(*host_), side_text(*device_));
  name_ = fmt::format("{}+{}", host_->backend(), device_->backend());
}

template <class Call>
decltype(auto) RoutedComm::route(Call&& call) {
  const bool on_device = DeviceBuffers::current() != nullptr;
  (on_device ? routes_->device : routes_->host).fetch_add(1, std::memory_order_relaxed);
  Communicator& side = on_device ? *device_ : *host_;
  std::optional<CheckedByCaller> checked;
  if (CheckedByCaller::active(this)) checked.emplace(&side);
  return call(side);
}

std::shared_ptr<Communicator> RoutedComm::group(std::span<const int> global_ranks) {
  std::shared_ptr<Communicator> host = host_->group(global_ranks);
  std::shared_ptr<Communicator> device = device_->group(global_ranks);
  return std::shared_ptr<Communicator>(new RoutedComm(std::move(host), std::move(device), routes_));
}

void RoutedComm::all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  route([&](Communicator& c) { c.all_reduce(in, out, count, dtype, op); });
}
void RoutedComm::reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) {
  route([&](Communicator& c) { c.reduce(in, out, count, dtype, op, root); });
}
void RoutedComm::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  route([&](Communicator& c) { c.broadcast(buffer, count, dtype, root); });
}
void RoutedComm::all_gather(const void* in, void* out, int64_t count, DType dtype) {
  route([&](Communicator& c) { c.all_gather(in, out, count, dtype); });
}
void RoutedComm::all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) {
  route([&](Communicator& c) { c.all_gather_v(in, out, counts, dtype); });
}
void RoutedComm::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  route([&](Communicator& c) { c.reduce_scatter(in, out, count, dtype, op); });
}
void RoutedComm::reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype, Reduce op) {
  route([&](Communicator& c) { c.reduce_scatter_v(in, out, counts, dtype, op); });
}
void RoutedComm::all_to_all(const void* in, void* out, int64_t count, DType dtype) {
  route([&](Communicator& c) { c.all_to_all(in, out, count, dtype); });
}
void RoutedComm::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                              std::span<const int64_t> recv_counts, DType dtype) {
  route([&](Communicator& c) { c.all_to_all_v(in, send_counts, out, recv_counts, dtype); });
}
void RoutedComm::all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                                   const FillPieces& fill) {
  route([&](Communicator& c) { c.all_to_all_pieces(in, send, out, recv, dtype, fill); });
}
void RoutedComm::send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  route([&](Communicator& c) { c.send(in, count, dtype, peer, tag); });
}
void RoutedComm::recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  route([&](Communicator& c) { c.recv(out, count, dtype, peer, tag); });
}
std::unique_ptr<Request> RoutedComm::start_send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  return route([&](Communicator& c) { return c.start_send(in, count, dtype, peer, tag); });
}
std::unique_ptr<Request> RoutedComm::start_recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  return route([&](Communicator& c) { return c.start_recv(out, count, dtype, peer, tag); });
}
void RoutedComm::barrier() {
  route([&](Communicator& c) { c.barrier(); });
}
std::unique_ptr<Request> RoutedComm::start_all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  return route([&](Communicator& c) { return c.start_all_reduce(in, out, count, dtype, op); });
}
std::unique_ptr<Request> RoutedComm::start_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                            DType dtype, Reduce op) {
  return route([&](Communicator& c) { return c.start_reduce_scatter_v(in, out, counts, dtype, op); });
}
std::unique_ptr<Request> RoutedComm::start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                        DType dtype) {
  return route([&](Communicator& c) { return c.start_all_gather_v(in, out, counts, dtype); });
}

// Host memory: the host side's, whatever the thread's buffers.
SharedRegions RoutedComm::shared_regions(int64_t bytes) {
  routes_->host.fetch_add(1, std::memory_order_relaxed);
  return host_->shared_regions(bytes);
}
void RoutedComm::shared_barrier() {
  routes_->host.fetch_add(1, std::memory_order_relaxed);
  host_->shared_barrier();
}
void RoutedComm::shared_exchange(int64_t bytes, const FillPieces& fill) {
  routes_->host.fetch_add(1, std::memory_order_relaxed);
  host_->shared_exchange(bytes, fill);
}

}  // namespace shardwise::comm
