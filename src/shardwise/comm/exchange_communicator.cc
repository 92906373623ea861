#include "shardwise/comm/exchange_communicator.h"

#include <cstring>
#include <numeric>

#include "shardwise/comm/reduce_kernels.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

void ByteExchange::send_bytes(std::string_view, int peer, int tag) {
  fail("send to rank {} (tag {}): {} has no point-to-point messages", peer, tag, describe());
}

std::string ByteExchange::recv_bytes(int peer, int tag) {
  fail("recv from rank {} (tag {}): {} has no point-to-point messages", peer, tag, describe());
}

namespace {

size_t bytes_of(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

int64_t sum_before(std::span<const int64_t> counts, size_t end) {
  return std::accumulate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(end), int64_t{0});
}

// What a rank puts into the all-gather: its call's signature, its counts, its data.
std::string encode(const CallSignature& call, std::span<const int64_t> counts, const void* data, size_t bytes) {
  const uint64_t n = counts.size();
  std::string out(sizeof call + sizeof n + n * sizeof(int64_t) + bytes, '\0');
  size_t at = 0;
  auto put = [&](const void* from, size_t size) {
    if (size) std::memcpy(out.data() + at, from, size);
    at += size;
  };
  put(&call, sizeof call);
  put(&n, sizeof n);
  put(counts.data(), n * sizeof(int64_t));
  put(data, bytes);
  return out;
}

}  // namespace

struct ExchangeCommunicator::Call {
  std::vector<std::string> raw;  // every rank's bytes
  std::vector<CallSignature> calls;
  std::vector<std::vector<int64_t>> counts;
  std::vector<const std::byte*> data;
  std::vector<size_t> data_bytes;
};

ExchangeCommunicator::ExchangeCommunicator(std::shared_ptr<ByteExchange> exchange) : exchange_(std::move(exchange)) {
  SW_CHECK(exchange_ != nullptr, "ExchangeCommunicator: no exchange given");
  rank_ = exchange_->rank(), size_ = exchange_->size();
  SW_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "ExchangeCommunicator: {} says rank {} of a group of {}",
           exchange_->describe(), rank_, size_);
  members_.resize(static_cast<size_t>(size_));
  std::iota(members_.begin(), members_.end(), 0);
}

ExchangeCommunicator::Call ExchangeCommunicator::gather(Collective op, int64_t count, DType dtype, Reduce reduce,
                                                        int root, std::span<const int64_t> counts, const void* data,
                                                        int64_t elements) {
  const std::string_view name = collective_name(op);
  SW_CHECK(!in_call_.exchange(true), "{}: another thread of rank {} is in a collective on this communicator over {}; "
           "its calls are made one at a time", name, rank_, exchange_->describe());
  struct Leave {
    std::atomic<bool>& flag;
    ~Leave() { flag = false; }
  } leave{in_call_};
  CallSignature mine = signature(op, count, dtype, reduce, root);
  mine.counts_hash = counts.empty() ? 0 : hash_counts(counts);
  Call c;
  c.raw = exchange_->all_gather_bytes(encode(mine, counts, data, bytes_of(elements, dtype)));
  SW_CHECK(static_cast<int>(c.raw.size()) == size_, "{}: {} returned {} ranks' bytes for a group of {}", name,
           exchange_->describe(), c.raw.size(), size_);
  for (size_t r = 0; r < c.raw.size(); ++r) {
    const std::string& b = c.raw[r];
    CallSignature call;
    uint64_t n = 0;
    SW_CHECK(b.size() >= sizeof call + sizeof n, "{}: rank {}'s {} bytes from {} are not a collective call", name, r,
             b.size(), exchange_->describe());
    std::memcpy(&call, b.data(), sizeof call);
    std::memcpy(&n, b.data() + sizeof call, sizeof n);
    SW_CHECK(n <= (b.size() - sizeof call - sizeof n) / sizeof(int64_t), "{}: rank {}'s {} bytes from {} are not a "
             "collective call", name, r, b.size(), exchange_->describe());
    std::vector<int64_t>& cs = c.counts.emplace_back(n);
    if (n) std::memcpy(cs.data(), b.data() + sizeof call + sizeof n, n * sizeof(int64_t));
    const size_t head = sizeof call + sizeof n + n * sizeof(int64_t);
    c.calls.push_back(call);
    c.data.push_back(reinterpret_cast<const std::byte*>(b.data()) + head);
    c.data_bytes.push_back(b.size() - head);
  }
  check_alike(c.calls, members_);
  if (op == Collective::AllGatherV || op == Collective::ReduceScatterV) {
    std::vector<std::span<const int64_t>> spans(c.counts.begin(), c.counts.end());
    check_same_counts(op, spans, members_);
  }
  if (op == Collective::AllToAllV) {  // counts: send counts, then receive counts
    for (size_t q = 0; q < c.counts.size(); ++q) {
      for (size_t p = 0; p < c.counts.size(); ++p) {
        const int64_t sent = c.counts[q][p], expected = c.counts[p][c.counts.size() + q];
        if (sent != expected) fail_all_to_all_counts(static_cast<int>(q), sent, static_cast<int>(p), expected);
      }
    }
  }
  return c;
}

void ExchangeCommunicator::reduce_into(const Call& call, int64_t offset, void* out, int64_t count, DType dtype,
                                       Reduce op) const {
  if (count == 0) return;
  std::vector<const void*> inputs;
  for (const std::byte* d : call.data) inputs.push_back(d + bytes_of(offset, dtype));
  reduce_buffers(inputs, out, count, dtype, op);
}

std::shared_ptr<Communicator> ExchangeCommunicator::group(std::span<const int> global_ranks) {
  group_index(global_ranks);
  fail("group: the exchange backend ({}) has no sub-groups, an exchange spans its whole group; make an "
       "ExchangeCommunicator over an exchange of the sub-group (a FileRendezvous in a directory of its own)",
       exchange_->describe());
}

void ExchangeCommunicator::all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  Call c = gather(Collective::AllReduce, count, dtype, op, -1, {}, in, count);
  reduce_into(c, 0, out, count, dtype, op);
}

void ExchangeCommunicator::reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) {
  check_root("reduce", root);
  Call c = gather(Collective::Reduce, count, dtype, op, root, {}, in, count);
  if (rank_ == root) reduce_into(c, 0, out, count, dtype, op);
}

void ExchangeCommunicator::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  check_root("broadcast", root);
  Call c = gather(Collective::Broadcast, count, dtype, Reduce::Sum, root, {}, buffer, rank_ == root ? count : 0);
  if (rank_ != root && count) std::memcpy(buffer, c.data[static_cast<size_t>(root)], bytes_of(count, dtype));
}

void ExchangeCommunicator::all_gather(const void* in, void* out, int64_t count, DType dtype) {
  Call c = gather(Collective::AllGather, count, dtype, Reduce::Sum, -1, {}, in, count);
  const size_t b = bytes_of(count, dtype);
  for (size_t r = 0; r < c.data.size() && b; ++r) std::memcpy(static_cast<std::byte*>(out) + r * b, c.data[r], b);
}

void ExchangeCommunicator::all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) {
  check_counts("all_gather_v", counts);
  Call c = gather(Collective::AllGatherV, 0, dtype, Reduce::Sum, -1, counts, in, counts[static_cast<size_t>(rank_)]);
  for (size_t r = 0; r < c.data.size(); ++r) {
    if (counts[r]) std::memcpy(static_cast<std::byte*>(out) + bytes_of(sum_before(counts, r), dtype), c.data[r], bytes_of(counts[r], dtype));
  }
}

void ExchangeCommunicator::reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) {
  Call c = gather(Collective::ReduceScatter, count, dtype, op, -1, {}, in, count * size_);
  reduce_into(c, count * rank_, out, count, dtype, op);
}

void ExchangeCommunicator::reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype,
                                            Reduce op) {
  check_counts("reduce_scatter_v", counts);
  Call c = gather(Collective::ReduceScatterV, 0, dtype, op, -1, counts, in, sum_before(counts, counts.size()));
  const auto me = static_cast<size_t>(rank_);
  reduce_into(c, sum_before(counts, me), out, counts[me], dtype, op);
}

void ExchangeCommunicator::all_to_all(const void* in, void* out, int64_t count, DType dtype) {
  Call c = gather(Collective::AllToAll, count, dtype, Reduce::Sum, -1, {}, in, count * size_);
  const size_t b = bytes_of(count, dtype);
  for (size_t p = 0; p < c.data.size() && b; ++p) {
    std::memcpy(static_cast<std::byte*>(out) + p * b, c.data[p] + static_cast<size_t>(rank_) * b, b);
  }
}

void ExchangeCommunicator::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                                        std::span<const int64_t> recv_counts, DType dtype) {
  check_counts("all_to_all_v (send counts)", send_counts);
  check_counts("all_to_all_v (receive counts)", recv_counts);
  std::vector<int64_t> both(send_counts.begin(), send_counts.end());
  both.insert(both.end(), recv_counts.begin(), recv_counts.end());
  Call c = gather(Collective::AllToAllV, 0, dtype, Reduce::Sum, -1, both, in, sum_before(send_counts, send_counts.size()));
  const auto me = static_cast<size_t>(rank_);
  for (size_t q = 0; q < c.data.size(); ++q) {
    const size_t b = bytes_of(recv_counts[q], dtype);
    if (b) {
      std::memcpy(static_cast<std::byte*>(out) + bytes_of(sum_before(recv_counts, q), dtype),
                  c.data[q] + bytes_of(sum_before(c.counts[q], me), dtype), b);
    }
  }
}

void ExchangeCommunicator::send(const void* in, int64_t count, DType dtype, int peer, int tag) {
  check_peer("send", peer);
  SW_CHECK(count >= 0, "send: negative count {}", count);
  exchange_->send_bytes(std::string_view(static_cast<const char*>(in), bytes_of(count, dtype)), peer, tag);
}

void ExchangeCommunicator::recv(void* out, int64_t count, DType dtype, int peer, int tag) {
  check_peer("recv", peer);
  SW_CHECK(count >= 0, "recv: negative count {}", count);
  const std::string got = exchange_->recv_bytes(peer, tag);
  const size_t want = bytes_of(count, dtype);
  if (got.size() != want) {
    fail_recv_size(rank_, count, dtype, static_cast<int64_t>(want), peer, tag, static_cast<int64_t>(got.size()));
  }
  if (want) std::memcpy(out, got.data(), want);
}

bool has_point_to_point(const Communicator& comm) {
  const auto* e = dynamic_cast<const ExchangeCommunicator*>(comm.carrier());
  return !e || e->exchange().has_messages();
}

void ExchangeCommunicator::barrier() { gather(Collective::Barrier, 0, DType::U8, Reduce::Sum, -1, {}, nullptr, 0); }

}  // namespace shardwise::comm
