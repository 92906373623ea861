#pragma once
// A communicator of two over the same ranks: calls on device buffers go to one, calls on host
// buffers to the other. An mpirun job on GPUs needs it: NCCL (comm/nccl.h) takes device pointers
// only, while the trainer also makes host-buffer calls (losses, metadata, checkpoint coordination,
// data) that MPI carries. `train` under mpirun with --device cuda runs on
// RoutedComm(MPI world, NcclComm over a duplicate of it) (cli/train/train_world.h).
//
// - A call made while a DeviceBuffers scope (comm/device_buffers.h) is alive on the calling thread
//   goes to `device`, every other call to `host`; the choice is made at the call (a start_* form's
//   at its start, and the request is the chosen side's).
// - rank(), size() and members() are the host's; the constructor checks that the device side has
//   the same ones (an Error naming both sides otherwise).
// - group() is a RoutedComm of both sides' groups over the same ranks (the host's made first; each
//   collective over the sub-group only, as the interface requires).
// - shared_regions, shared_barrier and shared_exchange are the host's (they are host memory), as are
//   the byte and object helpers (they are calls without a DeviceBuffers scope).
// - carrier() is the RoutedComm itself: a CheckedByCaller scope on it is opened on the side each of
//   its calls goes to, so the side skips its call checks as the scope asks.
// - routes(): how many calls went each way, this communicator's and its groups' together (the test
//   run of `train` prints them: cli/train/train_world.h).
#include <atomic>
#include <memory>
#include <string>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

class RoutedComm final : public Communicator {
 public:
  struct Routes {
    std::atomic<int64_t> host{0}, device{0};
  };
  RoutedComm(std::shared_ptr<Communicator> host, std::shared_ptr<Communicator> device);

  // "<host>+<device>", e.g. "mpi+nccl".
  std::string_view backend() const override { return name_; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::vector<int>& members() const override { return host_->members(); }
  std::shared_ptr<Communicator> group(std::span<const int> global_ranks) override;

  void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override;
  void reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) override;
  void broadcast(void* buffer, int64_t count, DType dtype, int root) override;
  void all_gather(const void* in, void* out, int64_t count, DType dtype) override;
  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) override;
  void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) override;
  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype, Reduce op) override;
  void all_to_all(const void* in, void* out, int64_t count, DType dtype) override;
  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType dtype) override;
  void all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                         const FillPieces& fill = {}) override;
  void send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  void recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  std::unique_ptr<Request> start_send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  std::unique_ptr<Request> start_recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  void barrier() override;
  SharedRegions shared_regions(int64_t bytes) override;
  void shared_barrier() override;
  void shared_exchange(int64_t bytes, const FillPieces& fill = {}) override;
  std::unique_ptr<Request> start_all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override;
  std::unique_ptr<Request> start_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                  DType dtype, Reduce op) override;
  std::unique_ptr<Request> start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                              DType dtype) override;
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::send;

  Communicator& host() const { return *host_; }
  Communicator& device() const { return *device_; }
  const Routes& routes() const { return *routes_; }

 private:
  RoutedComm(std::shared_ptr<Communicator> host, std::shared_ptr<Communicator> device, std::shared_ptr<Routes> routes);
  // Makes call(side) on the side of this thread's buffers, counted, in a CheckedByCaller scope on
  // it when one is open on this communicator.
  template <class Call>
  decltype(auto) route(Call&& call);
  std::shared_ptr<Communicator> host_, device_;
  std::shared_ptr<Routes> routes_;
  std::string name_;
};

}  // namespace shardwise::comm
