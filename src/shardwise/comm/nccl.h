#pragma once
// The `nccl` backend: collectives between GPUs. Built only where CUDA and NCCL are found
// (CMake option SHARDWISE_WITH_NCCL=AUTO|ON|OFF); link shardwise_comm_nccl to use it.
//
// - Every buffer pointer is a device pointer on this rank's GPU (counts, as everywhere, in
//   elements). Without a DeviceBuffers scope (comm/device_buffers.h) calls are synchronous: each
//   returns once its result is in `out` (the work runs on the communicator's own stream, which the
//   call waits for). Under a DeviceBuffers(cuda:device, stream) scope the work is queued on the
//   caller's `stream` and the call returns at once (the other backends' device-buffer contract).
// - An mpirun job's CUDA world: `auto nccl = std::make_shared<NcclComm>(mpi_world(), local_rank)`
//   (MPI carries the unique id, the call checks and the size headers); `MeshComm(mesh, nccl)` gives
//   the groups along mesh dims (each a new NCCL communicator over an MPI sub-group).
// - An NcclComm is built from a host Communicator (local threads, one GPU per thread, or MPI
//   processes) over the same ranks: host rank 0 creates the NCCL id and broadcasts it. The host
//   communicator also carries the call checks (SHARDWISE_COMM_CHECKS, call_check.h) and the size
//   header of each send, so a mismatch is the same Error on every rank and recv names both sizes.
// - Reductions are NCCL's: avg is ncclAvg (for floats NCCL multiplies by 1/n before summing, so the
//   bits may differ from sum-then-divide; integers are summed, then divided); bool is reduced as
//   u8 with max (or) and min (and). all_to_all(_v) are grouped ncclSend/ncclRecv, the v variants
//   of all_gather and reduce_scatter grouped broadcasts and reduces.
// - Tags: NCCL has none; messages between two ranks arrive in order. With checks on, the tag of the
//   size header must match, as with the other backends.
// - group() builds a new NCCL communicator over a host sub-group (collective over the sub-group only,
//   as the interface requires); split() uses ncclCommSplit, which every rank must call.
// - A rank that dies inside an NCCL call is not detected: the others wait in the GPU call.
#include <memory>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

struct CallSignature;

class NcclComm final : public Communicator {
 public:
  // Collective over `host`. `device`: this rank's CUDA device; -1 picks host rank % device count.
  explicit NcclComm(std::shared_ptr<Communicator> host, int device = -1);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string_view backend() const override { return "nccl"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::vector<int>& members() const override { return host_->members(); }
  std::shared_ptr<Communicator> group(std::span<const int> global_ranks) override;
  // ncclCommSplit: every rank of this communicator calls it; ranks of one color form a group,
  // ordered by key (then by rank). A negative color leaves the rank out (returns null).
  std::shared_ptr<NcclComm> split(int color, int key);

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
  void send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  void recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  void barrier() override;
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::send;

  Communicator& host() { return *host_; }
  int device() const { return device_; }
  void set_checks(bool on) { checks_ = on; }

 private:
  struct State;  // the NCCL communicator and the CUDA stream
  NcclComm(std::shared_ptr<Communicator> host, int device, std::unique_ptr<State> state);
  void check_call(const CallSignature& call, std::span<const int64_t> counts = {},
                  std::span<const int64_t> a2a_send = {}, std::span<const int64_t> a2a_recv = {});
  std::shared_ptr<Communicator> host_;
  int device_;
  bool checks_;
  std::unique_ptr<State> state_;
};

// CUDA devices visible to this process; 0 where there is no GPU or no driver (never throws).
int cuda_device_count();

}  // namespace shardwise::comm
