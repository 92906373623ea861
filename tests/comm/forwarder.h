#pragma once
// A communicator that forwards the pure virtual calls to another and keeps the base class's
// defaults for the rest: all_to_all_pieces packs, unpacks (as NCCL), no shared regions (its
// carrier() is itself). Tests of those defaults, and of callers on a backend without shared memory.
#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

class Forwarder : public Communicator {
 public:
  explicit Forwarder(Communicator& c) : c_(c) {}
  std::string_view backend() const override { return c_.backend(); }
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  const std::vector<int>& members() const override { return c_.members(); }
  std::shared_ptr<Communicator> group(std::span<const int> ranks) override { return c_.group(ranks); }
  void all_reduce(const void* in, void* out, int64_t n, DType t, Reduce op) override { c_.all_reduce(in, out, n, t, op); }
  void reduce(const void* in, void* out, int64_t n, DType t, Reduce op, int root) override { c_.reduce(in, out, n, t, op, root); }
  void broadcast(void* b, int64_t n, DType t, int root) override { c_.broadcast(b, n, t, root); }
  void all_gather(const void* in, void* out, int64_t n, DType t) override { c_.all_gather(in, out, n, t); }
  void all_gather_v(const void* in, void* out, std::span<const int64_t> n, DType t) override { c_.all_gather_v(in, out, n, t); }
  void reduce_scatter(const void* in, void* out, int64_t n, DType t, Reduce op) override { c_.reduce_scatter(in, out, n, t, op); }
  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> n, DType t, Reduce op) override {
    c_.reduce_scatter_v(in, out, n, t, op);
  }
  void all_to_all(const void* in, void* out, int64_t n, DType t) override { c_.all_to_all(in, out, n, t); }
  void all_to_all_v(const void* in, std::span<const int64_t> s, void* out, std::span<const int64_t> r, DType t) override {
    c_.all_to_all_v(in, s, out, r, t);
  }
  void send(const void* in, int64_t n, DType t, int peer, int tag) override { c_.send(in, n, t, peer, tag); }
  void recv(void* out, int64_t n, DType t, int peer, int tag) override { c_.recv(out, n, t, peer, tag); }
  void barrier() override { c_.barrier(); }

 private:
  Communicator& c_;
};

}  // namespace shardwise::comm
