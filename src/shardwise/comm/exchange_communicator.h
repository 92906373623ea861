#pragma once
// The `exchange` backend: a Communicator over a ByteExchange (comm/byte_exchange.h), for ranks
// whose group someone else made (a torchrun job's torch.distributed group, a shared directory).
//
// Every collective is one all_gather_bytes of each rank's call signature, counts and data; every
// rank then computes its own result from every rank's data (reductions in rank order with
// reduce_buffers: the same bits as the local backend). Every byte goes to every rank, so it is
// meant for control traffic (a checkpoint's plan and reports), not for training. Mismatched calls
// (operation, count, dtype, root, reduction, v counts) are the same Error on every rank.
// send/recv go through the exchange's messages where it has them (has_point_to_point() below), and
// are an Error otherwise. Sub-groups (group()) are an Error: an exchange spans its whole group.
// Calls are made by one thread at a time: two threads in collectives at once are an Error (an
// AsyncSaver over an exchange without messages makes collectives on its worker thread: the caller
// makes none on this communicator until AsyncSaver::finish()).
#include <atomic>
#include <memory>

#include "shardwise/comm/byte_exchange.h"
#include "shardwise/comm/call_check.h"
#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

class ExchangeCommunicator final : public Communicator {
 public:
  explicit ExchangeCommunicator(std::shared_ptr<ByteExchange> exchange);

  std::string_view backend() const override { return "exchange"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return members_; }
  ByteExchange& exchange() const { return *exchange_; }

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
  void send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  void recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  void barrier() override;

 private:
  std::shared_ptr<ByteExchange> exchange_;
  int rank_, size_;
  std::vector<int> members_;
  std::atomic<bool> in_call_{false};

  struct Call;  // one collective's gathered signatures, counts and data (exchange_communicator.cc)
  Call gather(Collective op, int64_t count, DType dtype, Reduce reduce, int root, std::span<const int64_t> counts,
              const void* data, int64_t elements);
  void reduce_into(const Call& call, int64_t offset, void* out, int64_t count, DType dtype, Reduce op) const;
};

// Whether send/recv work on `comm` (or the carrier it forwards to): false only on the exchange
// backend over an exchange without messages. A caller that can do without them asks first: a
// checkpoint save then sends its reports by collectives (ckpt/save.cc).
bool has_point_to_point(const Communicator& comm);

}  // namespace shardwise::comm
