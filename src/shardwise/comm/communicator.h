#pragma once
// One interface for collectives, whatever carries them (threads of one process, MPI processes,
// NCCL on GPUs).
//
// Conventions, stated once for every operation below:
// - Argument order is (input, output). Counts are in elements of `dtype`, never bytes.
// - "v" variants take one count per rank of the group (`counts[r]` = elements of rank r); every
//   rank passes the same counts. Zero counts are allowed, all-zero too.
// - Packed layout: a buffer holding one block per rank stores them back to back in rank order,
//   without gaps (block r starts at the sum of the counts before r).
// - A count, dtype, root or operation mismatch between ranks is an Error that names both ranks and
//   both values, raised on every rank of the call, never a hang or a crash.
// - Reductions of floats are deterministic: every rank gets the same bits.
// - in == out is allowed for all_reduce; other operations need distinct buffers.
// - send may return before the matching recv is posted, or not: callers order their sends and
//   receives so that blocking sends cannot deadlock (as with MPI_Send).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/dtype.h"
#include "shardwise/mesh/placement.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::comm {

// A collective started without waiting for it (Communicator::start_*): its buffers must stay
// alive and untouched until wait() returns. Every rank starts the same collectives in the same
// order and waits for them in the same order (the default implementation makes its call at
// wait()). Every request must be waited for; one never waited for is not made by the default
// implementation, and an MPI one is waited for by its destructor (a step unwinding from an error).
class Request {
 public:
  virtual ~Request() = default;
  // Blocks until the collective is done; later calls return at once.
  virtual void wait() = 0;
  // True when done (it may make progress); false when not done or not known without blocking.
  virtual bool test() { return false; }
};

// A request done at its start (a call that completed at once).
class DoneRequest final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// Reduction of a collective: the placements' four plus prod.
enum class Reduce : uint8_t { Sum, Avg, Max, Min, Prod };

// A buffer's pieces, grouped by rank (Communicator::all_to_all_pieces): rank p's pieces are
// [first[p], first[p + 1]) of offset / count (elements from the buffer's start, each >= 0).
struct Pieces {
  std::span<const int64_t> first;   // group size + 1 entries, first[0] = 0, non-decreasing
  std::span<const int64_t> offset;  // first.back() entries
  std::span<const int64_t> count;   // first.back() entries
  int64_t total(size_t rank) const;  // the elements of rank `rank`'s pieces
};
// Writes a rank's send pieces (Communicator::all_to_all_pieces' `fill`).
using FillPieces = std::function<void(int peer)>;

// Memory every member of a group can address (Communicator::shared_regions): at[r] is member r's
// region of `bytes` bytes (at least what was asked, the same on every member; 64-byte aligned).
// `call` counts the group's earlier shared_regions calls (the same on every member): a caller
// alternating between two halves of the regions picks the half by it.
struct SharedRegions {
  std::span<std::byte* const> at;  // empty: the group cannot share memory
  int64_t bytes = 0;
  int64_t call = 0;
  explicit operator bool() const { return !at.empty(); }
};
// Shared regions' alignment, of their addresses and sizes.
inline constexpr int64_t kRegionAlign = 64;
inline int64_t region_round_up(int64_t bytes) { return (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }
// A backend's new region size when `asked` bytes exceed the `current` ones: at least half again
// (few growths when the counts creep up), rounded up. The memory behind a region is that plus
// kRegionAlign, and aligned_region gives the region's start in it.
inline int64_t grown_region_bytes(int64_t asked, int64_t current) {
  return region_round_up(asked > current + current / 2 ? asked : current + current / 2);
}
inline std::byte* aligned_region(std::byte* memory) {
  const auto at = reinterpret_cast<uintptr_t>(memory);
  return memory + (kRegionAlign - at % kRegionAlign) % kRegionAlign;
}
Reduce to_reduce(mesh::ReduceOp op);
std::string_view reduce_name(Reduce op);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view backend() const = 0;  // "local", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The global ranks of this group's members, in group-rank order.
  virtual const std::vector<int>& members() const = 0;
  // The communicator that makes this one's calls: itself, or for a wrapper that forwards every
  // call (runtime::ProfiledCommunicator) the wrapped one's carrier. CheckedByCaller goes by it.
  virtual const Communicator* carrier() const { return this; }

  // A communicator over `global_ranks` (a subset of this one's members, in the given order) for
  // a member of it; every member must call it (collective over the sub-group only).
  virtual std::shared_ptr<Communicator> group(std::span<const int> global_ranks) = 0;

  // out = reduce over ranks of in.
  virtual void all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) = 0;
  // out on `root` = reduce over ranks of in; out is not touched (may be null) elsewhere.
  virtual void reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root) = 0;
  // Root's buffer is copied to every rank's buffer.
  virtual void broadcast(void* buffer, int64_t count, DType dtype, int root) = 0;
  // out (count * size elements) = every rank's `count` elements, packed.
  virtual void all_gather(const void* in, void* out, int64_t count, DType dtype) = 0;
  // Rank r contributes counts[r] elements; out = all of them, packed.
  virtual void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype) = 0;
  // in holds size blocks of `count` elements; rank r gets the reduction of every rank's block r.
  virtual void reduce_scatter(const void* in, void* out, int64_t count, DType dtype, Reduce op) = 0;
  // in holds blocks of counts[0], counts[1], ... elements, packed; rank r gets block r reduced.
  virtual void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype,
                                Reduce op) = 0;
  // in: block p (count elements) goes to rank p; out: block p came from rank p.
  virtual void all_to_all(const void* in, void* out, int64_t count, DType dtype) = 0;
  // send_counts[p] elements go to rank p (in packed), recv_counts[p] come from rank p (out
  // packed). Rank q's send_counts[p] must equal rank p's recv_counts[q].
  virtual void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                            std::span<const int64_t> recv_counts, DType dtype) = 0;
  // all_to_all_v with each rank's data in pieces anywhere in the buffers (the MoE dispatch: rows
  // land where the experts read them, no regrouping pass). The pieces pair up: rank q's i-th send
  // piece for p is rank p's i-th receive piece from q, of the same count (empty ones included);
  // the totals follow all_to_all_v's rule, checked alike; receive pieces must not overlap. No
  // agreement collective: MPI sends each non-empty piece as its own message, contiguous at both
  // ends (large ones take MPI's single-copy path). The default (NCCL) packs into a contiguous
  // buffer, runs all_to_all_v and unpacks.
  // `fill` (optional) lets the caller write its send pieces as they are needed, so that writing
  // the later ones overlaps the travel of the earlier (the MoE dispatch packs each peer's rows just
  // before their messages leave): fill(p) is called once for every rank p of the group, before p's
  // send pieces are read, and fill(rank()) last (MPI: ranks from rank() + 1 on as a ring, each
  // peer's messages started right after its fill; this rank's own call once every message has
  // started, before waiting for them, so it can also write into `out` outside the receive pieces).
  virtual void all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                                 const FillPieces& fill = {});
  // Point to point within this group (peer is a group rank). The receiver names the exact count;
  // a message of another size is an Error on the receiver naming both sizes.
  virtual void send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual void recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) = 0;
  // Non-blocking send / recv (the same arguments, checks and size Error, raised by the receive's
  // wait()); the buffer must stay alive and untouched until wait() returns. Between two ranks on
  // one tag, messages meet receives in the order they were started, blocking calls included (as
  // in MPI); tags do not order each other. local: a send copies straight into the receive posted
  // for it (or, none posted yet, into the channel's queue) and is done at its start; a receive is
  // done when its message arrives. MPI: MPI_Isend / MPI_Irecv. The default (NCCL, exchange, a
  // forwarding wrapper of tests) makes the blocking call at wait(), in the order of the waits: a
  // caller that waits in an order safe for blocking calls (on a ring: even ranks send first, odd
  // ones receive first) is right on every backend, and overlaps where the backend can.
  virtual std::unique_ptr<Request> start_send(const void* in, int64_t count, DType dtype, int peer, int tag = 0);
  virtual std::unique_ptr<Request> start_recv(void* out, int64_t count, DType dtype, int peer, int tag = 0);
  virtual void barrier() = 0;

  // Node-shared memory: the exchange that needs no messages when every member of the group is on
  // one node (the MoE dispatch writes each row straight into the region of the rank owning its
  // expert, DeepEP-style). Collective: every member calls it with the same `bytes` (derived from
  // what every member knows, e.g. the counts of a checked all_gather): a call within the current
  // size makes no collective and returns at once; one beyond it grows every region (a barrier,
  // then the old regions are freed and larger ones made; every pointer of an earlier call is then
  // invalid). Empty (every member alike) when the group cannot: MPI with a member on another node
  // (MPI_Comm_split_type SHARED, decided once per group) or NCCL; the local backend's regions are
  // plain memory of the process. MPI: one MPI_Win_allocate_shared window per group, freed with
  // the group (the world's before MPI_Finalize). A wrapper (carrier() != this) forwards to its
  // carrier.
  // The rules: between two shared_barrier calls a byte of any region is written by at most one
  // member and, if written, read by no other member; what a member wrote before a shared_barrier
  // is what every member reads after it. (A caller that wants no barrier before its next writes
  // alternates halves by SharedRegions::call: the barrier after the next call's writes is the one
  // that orders them after this call's reads.)
  virtual SharedRegions shared_regions(int64_t bytes);
  // The barrier of the shared regions: a barrier of the group that also orders memory (MPI:
  // MPI_Win_sync, MPI_Barrier, MPI_Win_sync on the window; local: the threads' rendezvous).
  // Only after shared_regions returned regions.
  virtual void shared_barrier();
  // One step of an exchange through the shared regions: fill(p) for every member p in
  // all_to_all_pieces' order (ring order from rank() + 1, rank() last; the caller writes what it
  // sends p into p's region), or nothing when `fill` is empty (a step that only waits for the
  // others' writes), then shared_barrier(). `bytes`: what this member moves in the step, counted as
  // the message exchange the step stands for counts its send pieces, so that a profiling wrapper
  // (runtime::ProfiledCommunicator) records it like that exchange: an all_to_all of `bytes`. A
  // wrapper forwards to its carrier.
  virtual void shared_exchange(int64_t bytes, const FillPieces& fill = {});

  // Non-blocking all_reduce / reduce_scatter_v (same arguments, results and call checks; the
  // result is defined after wait()). The default completes at wait(), where it makes the blocking
  // call: the local (threads) and NCCL backends use it; MPI starts MPI_Iallreduce /
  // MPI_Ireduce_scatter. A started collective does not match a blocking one.
  virtual std::unique_ptr<Request> start_all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op);
  virtual std::unique_ptr<Request> start_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                          DType dtype, Reduce op);
  // Non-blocking all_gather_v (same arguments and results; MPI: MPI_Iallgatherv; the default
  // completes at wait()). Sharding stage 3 prefetches the next layer's parameters with it.
  virtual std::unique_ptr<Request> start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                      DType dtype);

  // Tensor helpers (contiguous tensors; shapes must agree across ranks).
  void all_reduce(const Tensor& in, Tensor& out, Reduce op);
  void all_reduce(Tensor& inout, Reduce op) { all_reduce(inout, inout, op); }
  void broadcast(Tensor& t, int root) { broadcast(t.raw(), t.numel(), t.dtype(), root); }
  void send(const Tensor& t, int peer, int tag = 0) { send(t.raw(), t.numel(), t.dtype(), peer, tag); }
  void recv(Tensor& t, int peer, int tag = 0) { recv(t.raw(), t.numel(), t.dtype(), peer, tag); }

  // Bytes (any serialization): every rank gets root's bytes / every rank's bytes in rank order.
  std::vector<std::byte> broadcast_bytes(std::span<const std::byte> bytes, int root);
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> bytes);
  // Objects (nested numbers, strings, lists, maps) travel as JSON text: comm/objects.h.

 protected:
  // Shared argument checks of the implementations (Error with the operation's name).
  void check_root(const char* op, int root) const;
  void check_peer(const char* op, int peer) const;
  void check_counts(const char* op, std::span<const int64_t> counts) const;  // one per rank, >= 0
  // Checks `p` (shape, counts and offsets >= 0) and returns each rank's total.
  std::vector<int64_t> check_pieces(const char* op, const Pieces& p) const;
  // Checks the argument of group() (members of this group, each once, this rank among them) and
  // returns this rank's index in it.
  int group_index(std::span<const int> global_ranks) const;
};

// Calls `fill` (when given) for every rank of `c`, from c.rank() + 1 on as a ring, c.rank() last:
// all_to_all_pieces' order for backends that need every piece before they start.
void fill_every_peer(const Communicator& c, const FillPieces& fill);

// While alive, this thread's calls on `group` skip the call checks of the backends that make
// them with messages (MPI, NCCL: a signature all-gather before each collective, and before an
// all-to-all a counts all-to-all and an all-gather of disagreements). For a caller whose calls on
// the group follow one fixed sequence after a checked collective that carried what the later ones
// need (the MoE kernel: the router's all_gather gives every rank every peer's counts, so the two
// exchanges that follow agree by construction); a mismatch at that first call is still an Error
// on every rank. Argument checks stay, and MPI still checks each received piece's size. The local
// backend checks regardless (its checks read the shared slots it meets at anyway). Scopes nest;
// other threads' calls are not affected. Every rank of the group must be in such a scope alike.
class CheckedByCaller {
 public:
  explicit CheckedByCaller(const Communicator* group);  // null: no effect
  ~CheckedByCaller();
  CheckedByCaller(const CheckedByCaller&) = delete;
  CheckedByCaller& operator=(const CheckedByCaller&) = delete;
  // True while this thread holds a scope on `group`.
  static bool active(const Communicator* group);

 private:
  const Communicator* group_;
};

// The communicators of one rank along mesh dims: for each subset of mesh dims, the group of
// ranks that differ from this rank only in those dims (e.g. the tp group of a dp x tp mesh).
// The mesh's process ids are ranks of `world`.
class MeshComm {
 public:
  MeshComm(mesh::ProcessMesh mesh, std::shared_ptr<Communicator> world);
  const mesh::ProcessMesh& mesh() const { return mesh_; }
  int64_t rank_index() const { return rank_index_; }
  // The group along `mesh_dims` (in that order of mesh dims). Created on first use: every rank of
  // the group must ask for it in the same order.
  Communicator& along(std::span<const int> mesh_dims);
  Communicator& along(int mesh_dim) { return along(std::span<const int>(&mesh_dim, 1)); }
  Communicator& world() { return *world_; }

 private:
  mesh::ProcessMesh mesh_;
  std::shared_ptr<Communicator> world_;
  int64_t rank_index_ = 0;
  std::vector<std::pair<uint32_t, std::shared_ptr<Communicator>>> groups_;
};

}  // namespace shardwise::comm
