#include "shardwise/comm/call_check.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardwise/core/error.h"

namespace shardwise::comm {

std::string_view collective_name(Collective op) {
  switch (op) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::Reduce: return "reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllGather: return "all_gather";
    case Collective::AllGatherV: return "all_gather_v";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::ReduceScatterV: return "reduce_scatter_v";
    case Collective::AllToAll: return "all_to_all";
    case Collective::AllToAllV: return "all_to_all_v";
    case Collective::Barrier: return "barrier";
    case Collective::StartAllReduce: return "start_all_reduce";
    case Collective::StartReduceScatterV: return "start_reduce_scatter_v";
    case Collective::StartAllGatherV: return "start_all_gather_v";
    case Collective::AllToAllPieces: return "all_to_all_pieces";
  }
  return "?";
}

CallSignature signature(Collective op, int64_t count, DType dtype, Reduce reduce, int root) {
  CallSignature s;
  s.op = op, s.count = count, s.dtype = dtype, s.reduce = reduce, s.root = root;
  return s;
}

uint64_t hash_counts(std::span<const int64_t> counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
  for (int64_t c : counts) {
    h ^= static_cast<uint64_t>(c);
    h *= 1099511628211ull;
  }
  return h ^ counts.size();
}

void check_alike(std::span<const CallSignature> calls, std::span<const int> members) {
  const CallSignature& a = calls[0];
  auto op = collective_name(a.op);
  for (size_t r = 1; r < calls.size(); ++r) {
    const CallSignature& b = calls[r];
    if (a.op != b.op) {
      fail("collective mismatch: rank {} called {} while rank {} called {}", members[0], op, members[r],
           collective_name(b.op));
    }
    if ((a.same_count && a.count != b.count) || a.dtype != b.dtype) {
      fail("{}: rank {} passes {} elements of {} but rank {} passes {} elements of {}", op, members[0], a.count,
           dtype_name(a.dtype), members[r], b.count, dtype_name(b.dtype));
    }
    if (a.root != b.root) {
      fail("{}: rank {} uses root {} but rank {} uses root {}", op, members[0], a.root, members[r], b.root);
    }
    if (a.reduce != b.reduce) {
      fail("{}: rank {} reduces with {} but rank {} with {}", op, members[0], reduce_name(a.reduce), members[r],
           reduce_name(b.reduce));
    }
  }
}

void check_same_counts(Collective op, std::span<const std::span<const int64_t>> counts, std::span<const int> members) {
  for (size_t r = 1; r < counts.size(); ++r) {
    auto a = counts[0], b = counts[r];
    if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) {
      fail("{}: rank {} passes counts [{}] but rank {} passes [{}]", collective_name(op), members[0],
           fmt::join(a, ","), members[r], fmt::join(b, ","));
    }
  }
}

void fail_all_to_all_counts(int from, int64_t sent, int to, int64_t expected, Collective op) {
  fail("{}: rank {} sends {} elements to rank {}, but rank {} expects {} from rank {}", collective_name(op), from, sent,
       to, to, expected, from);
}

void fail_recv_size(int receiver, int64_t count, DType dtype, int64_t want, int sender, int tag, int64_t got) {
  fail("recv: rank {} expects {} elements of {} ({} bytes) from rank {} (tag {}), but the message has {} bytes", receiver,
       count, dtype_name(dtype), want, sender, tag, got);
}

void check_call(const CheckExchange& exchange, const CallSignature& mine, std::span<const int> members,
                std::span<const int64_t> counts, std::span<const int64_t> a2a_send, std::span<const int64_t> a2a_recv) {
  const size_t n = members.size();
  std::vector<CallSignature> calls(n);
  exchange.all_gather(&mine, calls.data(), sizeof(CallSignature));
  check_alike(calls, members);
  // The counts travel only when their hashes differ: the Error then shows both lists.
  bool counts_differ = std::any_of(calls.begin(), calls.end(),
                                   [&](const CallSignature& c) { return c.counts_hash != calls[0].counts_hash; });
  if (counts_differ) {
    std::vector<int64_t> all(n * counts.size());
    exchange.all_gather(counts.data(), all.data(), counts.size() * sizeof(int64_t));
    std::vector<std::span<const int64_t>> per_rank;
    for (size_t r = 0; r < n; ++r) per_rank.emplace_back(all.data() + r * counts.size(), counts.size());
    check_same_counts(mine.op, per_rank, members);
  }
  if (mine.op != Collective::AllToAllV && mine.op != Collective::AllToAllPieces) return;
  // Each rank learns what every peer sends it and reports its first disagreement; every rank
  // then raises the one with the lowest (sender, receiver), as the local backend does.
  std::vector<int64_t> incoming(n);
  exchange.all_to_all_counts(a2a_send.data(), incoming.data());
  struct Disagreement {
    int64_t from = -1, sent = 0, expected = 0;
  } own;
  for (size_t q = 0; q < n; ++q) {
    if (incoming[q] != a2a_recv[q]) {
      own = {static_cast<int64_t>(q), incoming[q], a2a_recv[q]};
      break;
    }
  }
  std::vector<Disagreement> all(n);
  exchange.all_gather(&own, all.data(), sizeof(Disagreement));
  int64_t best = -1;
  for (size_t p = 0; p < n; ++p) {
    if (all[p].from >= 0 && (best < 0 || all[p].from < all[static_cast<size_t>(best)].from)) best = static_cast<int64_t>(p);
  }
  if (best >= 0) {
    const Disagreement& d = all[static_cast<size_t>(best)];
    fail_all_to_all_counts(members[static_cast<size_t>(d.from)], d.sent, members[static_cast<size_t>(best)], d.expected,
                           mine.op);
  }
}

bool call_checks_default() {
  static const bool on = [] {
    const char* v = std::getenv("SHARDWISE_COMM_CHECKS");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

}  // namespace shardwise::comm
