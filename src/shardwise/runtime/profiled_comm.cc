#include "shardwise/runtime/profiled_comm.h"

#include <numeric>

#include "shardwise/runtime/profiler.h"

namespace shardwise::runtime {

namespace {

int64_t nbytes(int64_t count, DType dtype) { return count * static_cast<int64_t>(dtype_size(dtype)); }

// Records the time a wait blocks.
class ProfiledRequest final : public comm::Request {
 public:
  ProfiledRequest(std::unique_ptr<comm::Request> inner, const char* name, int64_t bytes)
      : inner_(std::move(inner)), name_(name), bytes_(bytes) {}
  void wait() override {
    ProfileScope s(EventKind::Collective, name_, bytes_);
    inner_->wait();
  }
  bool test() override { return inner_->test(); }

 private:
  std::unique_ptr<comm::Request> inner_;
  const char* name_;
  int64_t bytes_;
};

int64_t sum(std::span<const int64_t> counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

}  // namespace

std::shared_ptr<comm::Communicator> ProfiledCommunicator::group(std::span<const int> global_ranks) {
  return std::make_shared<ProfiledCommunicator>(inner_->group(global_ranks));
}

void ProfiledCommunicator::all_reduce(const void* in, void* out, int64_t count, DType dtype, comm::Reduce op) {
  ProfileScope s(EventKind::Collective, "all_reduce", nbytes(count, dtype));
  inner_->all_reduce(in, out, count, dtype, op);
}

void ProfiledCommunicator::reduce(const void* in, void* out, int64_t count, DType dtype, comm::Reduce op, int root) {
  ProfileScope s(EventKind::Collective, "reduce", nbytes(count, dtype));
  inner_->reduce(in, out, count, dtype, op, root);
}

void ProfiledCommunicator::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  ProfileScope s(EventKind::Collective, "broadcast", nbytes(count, dtype));
  inner_->broadcast(buffer, count, dtype, root);
}

void ProfiledCommunicator::all_gather(const void* in, void* out, int64_t count, DType dtype) {
  ProfileScope s(EventKind::Collective, "all_gather", nbytes(count, dtype));
  inner_->all_gather(in, out, count, dtype);
}

void ProfiledCommunicator::all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) {
  ProfileScope s(EventKind::Collective, "all_gather", nbytes(counts[static_cast<size_t>(rank())], dtype));
  inner_->all_gather_v(in, out, counts, dtype);
}

void ProfiledCommunicator::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, comm::Reduce op) {
  ProfileScope s(EventKind::Collective, "reduce_scatter", nbytes(count * size(), dtype));
  inner_->reduce_scatter(in, out, count, dtype, op);
}

void ProfiledCommunicator::reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype,
                                            comm::Reduce op) {
  ProfileScope s(EventKind::Collective, "reduce_scatter", nbytes(sum(counts), dtype));
  inner_->reduce_scatter_v(in, out, counts, dtype, op);
}

void ProfiledCommunicator::all_to_all(const void* in, void* out, int64_t count, DType dtype) {
  ProfileScope s(EventKind::Collective, "all_to_all", nbytes(count * size(), dtype));
  inner_->all_to_all(in, out, count, dtype);
}

void ProfiledCommunicator::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                                        std::span<const int64_t> recv_counts, DType dtype) {
  ProfileScope s(EventKind::Collective, "all_to_all", nbytes(sum(send_counts), dtype));
  inner_->all_to_all_v(in, send_counts, out, recv_counts, dtype);
}

void ProfiledCommunicator::all_to_all_pieces(const void* in, const comm::Pieces& send, void* out,
                                             const comm::Pieces& recv, DType dtype, const comm::FillPieces& fill) {
  int64_t total = 0;
  for (size_t p = 0; p + 1 < send.first.size(); ++p) total += send.total(p);
  ProfileScope s(EventKind::Collective, "all_to_all", nbytes(total, dtype));
  inner_->all_to_all_pieces(in, send, out, recv, dtype, fill);
}

void ProfiledCommunicator::send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  ProfileScope s(EventKind::Collective, "send", nbytes(count, dtype));
  inner_->send(in, count, dtype, peer, tag);
}

void ProfiledCommunicator::recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  ProfileScope s(EventKind::Collective, "recv", nbytes(count, dtype));
  inner_->recv(out, count, dtype, peer, tag);
}

void ProfiledCommunicator::barrier() {
  ProfileScope s(EventKind::Collective, "barrier");
  inner_->barrier();
}

void ProfiledCommunicator::shared_exchange(int64_t bytes, const comm::FillPieces& fill) {
  ProfileScope s(EventKind::Collective, "all_to_all", bytes, "shared memory");
  inner_->shared_exchange(bytes, fill);
}

std::unique_ptr<comm::Request> ProfiledCommunicator::start_all_reduce(const void* in, void* out, int64_t count,
                                                                      DType dtype, comm::Reduce op) {
  ProfileScope s(EventKind::Collective, "start_all_reduce", nbytes(count, dtype));
  return std::make_unique<ProfiledRequest>(inner_->start_all_reduce(in, out, count, dtype, op), "wait_all_reduce",
                                           nbytes(count, dtype));
}

std::unique_ptr<comm::Request> ProfiledCommunicator::start_reduce_scatter_v(const void* in, void* out,
                                                                            std::span<const int64_t> counts,
                                                                            DType dtype, comm::Reduce op) {
  const int64_t total = sum(counts);
  ProfileScope s(EventKind::Collective, "start_reduce_scatter_v", nbytes(total, dtype));
  return std::make_unique<ProfiledRequest>(inner_->start_reduce_scatter_v(in, out, counts, dtype, op),
                                           "wait_reduce_scatter_v", nbytes(total, dtype));
}

std::unique_ptr<comm::Request> ProfiledCommunicator::start_all_gather_v(const void* in, void* out,
                                                                        std::span<const int64_t> counts, DType dtype) {
  const int64_t mine = nbytes(counts[static_cast<size_t>(rank())], dtype);  // as all_gather_v counts
  ProfileScope s(EventKind::Collective, "start_all_gather_v", mine);
  return std::make_unique<ProfiledRequest>(inner_->start_all_gather_v(in, out, counts, dtype), "wait_all_gather_v", mine);
}

std::unique_ptr<comm::Request> ProfiledCommunicator::start_send(const void* in, int64_t count, DType dtype, int peer,
                                                                int tag) {
  ProfileScope s(EventKind::Collective, "start_send", nbytes(count, dtype));
  return std::make_unique<ProfiledRequest>(inner_->start_send(in, count, dtype, peer, tag), "wait_send",
                                           nbytes(count, dtype));
}

std::unique_ptr<comm::Request> ProfiledCommunicator::start_recv(void* out, int64_t count, DType dtype, int peer,
                                                                int tag) {
  ProfileScope s(EventKind::Collective, "start_recv", nbytes(count, dtype));
  return std::make_unique<ProfiledRequest>(inner_->start_recv(out, count, dtype, peer, tag), "wait_recv",
                                           nbytes(count, dtype));
}

}  // namespace shardwise::runtime
