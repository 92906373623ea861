#pragma once
// A Communicator that forwards every call to another and records it as a Collective event in the
// calling thread's active profile (profiler.h): its name, time and bytes (this rank's input; for
// recv the bytes received; for a shared-memory exchange step the bytes its caller names). Its
// groups are profiled too. `shardwise train --profile` hands the Trainer a ProfiledCommunicator
// over the world, so reshards, collective kernels (the MoE exchanges on either path included),
// pipeline sends, the gradient norm and the sharded optimizer's collectives are all seen.
#include <memory>

#include "shardwise/comm/communicator.h"

namespace shardwise::runtime {

class ProfiledCommunicator : public comm::Communicator {
 public:
  explicit ProfiledCommunicator(std::shared_ptr<comm::Communicator> inner) : inner_(std::move(inner)) {}

  std::string_view backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& members() const override { return inner_->members(); }
  const comm::Communicator* carrier() const override { return inner_->carrier(); }
  std::shared_ptr<Communicator> group(std::span<const int> global_ranks) override;

  void all_reduce(const void* in, void* out, int64_t count, DType dtype, comm::Reduce op) override;
  void reduce(const void* in, void* out, int64_t count, DType dtype, comm::Reduce op, int root) override;
  void broadcast(void* buffer, int64_t count, DType dtype, int root) override;
  void all_gather(const void* in, void* out, int64_t count, DType dtype) override;
  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) override;
  void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, comm::Reduce op) override;
  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype,
                        comm::Reduce op) override;
  void all_to_all(const void* in, void* out, int64_t count, DType dtype) override;
  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType dtype) override;
  void all_to_all_pieces(const void* in, const comm::Pieces& send, void* out, const comm::Pieces& recv, DType dtype,
                         const comm::FillPieces& fill = {}) override;
  void send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  void recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  void barrier() override;
  // Recorded as an all_to_all of `bytes` (the message exchange it stands for) with the detail
  // "shared memory": the writes and the barrier.
  void shared_exchange(int64_t bytes, const comm::FillPieces& fill = {}) override;
  // Recorded as `start_...` at the start and `wait_...` when waited for (the time blocked there).
  std::unique_ptr<comm::Request> start_all_reduce(const void* in, void* out, int64_t count, DType dtype,
                                                  comm::Reduce op) override;
  std::unique_ptr<comm::Request> start_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                        DType dtype, comm::Reduce op) override;
  std::unique_ptr<comm::Request> start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                    DType dtype) override;
  std::unique_ptr<comm::Request> start_send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  std::unique_ptr<comm::Request> start_recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;

  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::send;

 private:
  std::shared_ptr<comm::Communicator> inner_;
};

}  // namespace shardwise::runtime
