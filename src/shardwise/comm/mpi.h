#pragma once
// The `mpi` backend: one process per rank, launched by `mpirun -np N program ...`.
//
// - Every operation is one MPI call (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Alltoallv, ...)
//   on host buffers. Counts above the int range of MPI 3 (INT_MAX elements) are handled: reductions
//   are cut into chunks, data movement uses a derived datatype that holds the whole block, and the
//   v variants whose counts or displacements leave the int range fall back to one broadcast,
//   reduce or send/recv per rank.
// - Reductions: f16 and bf16 (no MPI type) and the max/min of floats (NaN propagates, as in the
//   local backend) use user-defined, commutative MPI_Ops built on reduce_kernels.h; the rest use
//   MPI's built-in ops. Avg = sum, then every rank divides by the group size (integers truncate).
// - Every rank gets the same bits: the results come from MPI_Allreduce. OpenMPI's algorithms either
//   compute each element once and distribute it (ring, Rabenseifner) or combine the same two
//   partial results on both partners of a step (recursive doubling), and every op used here is
//   commutative to the bit, so the partners agree. tests/comm_mpi checks it on 2 and 4 ranks.
//   (A reduce + broadcast would guarantee it independently of the algorithm but halves the
//   bandwidth.)
// - Call checks: before each collective the ranks all-gather a 32-byte signature (operation,
//   count, dtype, root, reduction, hash of v counts), so a mismatch raises the same Error on every
//   rank instead of a hang or wrong data (call_check.h). SHARDWISE_COMM_CHECKS=0 or set_checks(false)
//   skips it, as does a CheckedByCaller scope for its thread's calls (communicator.h). recv probes
//   the message and raises an Error naming both sizes.
// - MPI errors come back as return codes (MPI_ERRORS_RETURN) and are thrown as shardwise::Error.
//   A rank that throws out of run_mpi_main aborts the whole job (MPI_Abort), so no rank hangs.
// - User tags are 0 .. MPI_TAG_UB - 1; MPI_TAG_UB itself is kept for the fallback paths.
// - shared_regions: a shared-memory window per group whose members are all on one node, freed
//   with the group; the world's is freed before MPI_Finalize.
#include <mpi.h>

#include <functional>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

struct CallSignature;

class MpiComm final : public Communicator {
 public:
  // Takes `comm` over (freed on destruction unless it is MPI_COMM_WORLD or MPI_COMM_SELF);
  // `members` are the global ranks of its ranks.
  MpiComm(MPI_Comm comm, std::vector<int> members);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  std::string_view backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  // MPI_Comm_create_group: collective over the new group's members only.
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
  // One MPI_Isend / MPI_Irecv per non-empty piece (beyond max_count elements: a derived type
  // spanning it): every receive posted, then each peer's fill and sends in ring order, then this
  // rank's fill and its pieces to itself copied; each receive's size checked.
  void all_to_all_pieces(const void* in, const Pieces& send, void* out, const Pieces& recv, DType dtype,
                         const FillPieces& fill = {}) override;
  void send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  void recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  // MPI_Isend / MPI_Irecv (a receive's size checked at its wait: one of another size is an Error
  // naming both, a larger one MPI's truncation).
  std::unique_ptr<Request> start_send(const void* in, int64_t count, DType dtype, int peer, int tag = 0) override;
  std::unique_ptr<Request> start_recv(void* out, int64_t count, DType dtype, int peer, int tag = 0) override;
  void barrier() override;
  // MPI_Iallreduce / MPI_Ireduce_scatter with the blocking calls' types and ops (so every rank gets
  // the same bits, as above); beyond max_count elements, the blocking fallback at start.
  std::unique_ptr<Request> start_all_reduce(const void* in, void* out, int64_t count, DType dtype, Reduce op) override;
  std::unique_ptr<Request> start_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                  DType dtype, Reduce op) override;
  // MPI_Iallgatherv; beyond max_count elements in all, the blocking all_gather_v at start.
  std::unique_ptr<Request> start_all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                              DType dtype) override;
  // One MPI_Win_allocate_shared window over the group once MPI_Comm_split_type(SHARED) showed
  // every member on this node (an MPI_Allreduce on the first call); held in a passive epoch
  // (MPI_Win_lock_all) until freed. Empty when a member is on another node.
  SharedRegions shared_regions(int64_t bytes) override;
  // MPI_Win_sync, MPI_Barrier, MPI_Win_sync: the memory model's barrier for a shared window.
  void shared_barrier() override;
  // Frees the shared window (collective over the group, after a shared_barrier); the destructor
  // and the finalization of MPI call it.
  void free_shared();
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::send;

  MPI_Comm native() const { return comm_; }
  // A new communicator over the same ranks (MPI_Comm_dup, collective), with this one's checks and
  // max count: its messages never meet this one's (a second carrier beside it, comm/routed.h).
  std::shared_ptr<MpiComm> dup() const;
  // Call checks on this communicator (default: call_checks_default()); set alike on every rank.
  void set_checks(bool on) { checks_ = on; }
  bool checks() const { return checks_; }
  // The most elements one MPI call carries (default INT_MAX). Tests lower it to run the
  // large-count paths on small buffers; it must be the same on every rank. Sub-groups inherit it.
  void set_max_count(int64_t max_count);

 private:
  void check_call(const CallSignature& call, std::span<const int64_t> counts = {},
                  std::span<const int64_t> a2a_send = {}, std::span<const int64_t> a2a_recv = {});
  void reduce_chunks(const void* in, void* out, int64_t count, DType dtype, Reduce op, int root);
  void check_point(const char* op, int64_t count, int peer, int tag) const;  // send / recv's arguments
  MPI_Comm comm_;
  std::vector<int> members_;
  int rank_ = 0;
  int internal_tag_ = 0;
  bool checks_ = true;
  int64_t max_count_ = 0;
  int on_one_node_ = -1;  // shared_regions: -1 not asked yet
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte*> regions_;
  int64_t region_bytes_ = 0, region_calls_ = 0;
};

// True when this process was started by mpirun/mpiexec (OpenMPI, MPICH/PMI or PMIx variables).
bool launched_by_mpirun();
// This process's rank among the job's processes on its node, from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID); -1 when
// none is set.
int mpi_local_rank();

// The world communicator. Initializes MPI on first use (MPI_THREAD_MULTIPLE requested) unless the
// program already did, and then finalizes it at exit. A process started without mpirun is a world
// of one.
std::shared_ptr<MpiComm> mpi_world();

// Runs fn(mpi_world()) and returns 0. If fn throws on any rank, prints
// `shardwise: error: rank R: <message>` to stderr and aborts the whole job (MPI_Abort with status 1),
// so the other ranks do not wait forever for the failed one.
int run_mpi_main(const std::function<void(Communicator&)>& fn);

}  // namespace shardwise::comm
