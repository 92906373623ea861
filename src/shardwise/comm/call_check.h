#pragma once
// Checks that every rank of a group makes the same collective call, shared by the backends.
//
// Each rank describes its call with a CallSignature; once every rank holds every rank's signature
// (the local backend reads them from shared memory, MPI and NCCL exchange them with one all-gather),
// every rank runs the same comparison and so raises the same Error, naming both ranks and both
// values. Ranks are named by their global rank (`members`).
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

enum class Collective : uint8_t {
  AllReduce, Reduce, Broadcast, AllGather, AllGatherV, ReduceScatter, ReduceScatterV, AllToAll, AllToAllV, Barrier,
  StartAllReduce, StartReduceScatterV, StartAllGatherV,  // the non-blocking ones (MPI: they match only each other)
  AllToAllPieces
};
std::string_view collective_name(Collective op);

// Plain bytes (it travels as such between processes).
struct CallSignature {
  Collective op = Collective::Barrier;
  DType dtype = DType::U8;
  Reduce reduce = Reduce::Sum;
  uint8_t same_count = 1;  // 0: `count` may differ between ranks (all_gather_v: this rank's count)
  int32_t root = -1;
  int64_t count = 0;
  uint64_t counts_hash = 0;  // hash of the per-rank counts of v variants, 0 otherwise
};
CallSignature signature(Collective op, int64_t count, DType dtype, Reduce reduce = Reduce::Sum, int root = -1);
uint64_t hash_counts(std::span<const int64_t> counts);

// Throws the Error for the first rank whose call differs from rank 0's (operation, count and
// dtype, root, reduction), or returns when all agree. Counts hashes are not compared here.
void check_alike(std::span<const CallSignature> calls, std::span<const int> members);
// Throws when a rank's per-rank counts differ from rank 0's.
void check_same_counts(Collective op, std::span<const std::span<const int64_t>> counts, std::span<const int> members);
// The Error of an all_to_all_v whose rank `from` sends `sent` elements to rank `to`, which expects
// `expected` (global ranks).
[[noreturn]] void fail_all_to_all_counts(int from, int64_t sent, int to, int64_t expected,
                                         Collective op = Collective::AllToAllV);

// The Error of a recv of `count` elements (`want` bytes) that found a message of `got` bytes.
[[noreturn]] void fail_recv_size(int receiver, int64_t count, DType dtype, int64_t want, int sender, int tag, int64_t got);

// The whole check for backends that exchange signatures through messages. `all_gather(mine,
// all, bytes)` gathers `bytes` bytes from every rank, packed in rank order, without checks of its
// own; `all_to_all_counts(send, recv)` sends send[p] to rank p and receives recv[q] from rank q.
struct CheckExchange {
  std::function<void(const void* mine, void* all, size_t bytes)> all_gather;
  std::function<void(const int64_t* send, int64_t* recv)> all_to_all_counts;
};
// `counts`: the per-rank counts of a v variant (every rank must pass the same), else empty.
// `a2a_send`/`a2a_recv`: all_to_all_v's counts, else empty.
void check_call(const CheckExchange& exchange, const CallSignature& mine, std::span<const int> members,
                std::span<const int64_t> counts = {}, std::span<const int64_t> a2a_send = {},
                std::span<const int64_t> a2a_recv = {});

// SHARDWISE_COMM_CHECKS=0 turns the call checks of the message-passing backends off (benchmarks);
// they are on otherwise. Read once.
bool call_checks_default();

}  // namespace shardwise::comm
