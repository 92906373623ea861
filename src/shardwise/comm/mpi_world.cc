// The MPI world (MPI initialised once, MPI_COMM_WORLD duplicated) and how a job's ranks end.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "shardwise/comm/mpi.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

void check_mpi(int code, const char* call);  // mpi.cc

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(name)) return true;
  }
  return false;
}

int mpi_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return -1;
}

namespace {
void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  try {
    mpi_world()->free_shared();  // (initialised: this runs only once mpi_world made the world)
  } catch (const Error&) {
  }
  MPI_Finalize();
}
}  // namespace

std::shared_ptr<MpiComm> mpi_world() {
  static std::shared_ptr<MpiComm> world;
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      std::atexit(finalize_mpi);
    }
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    // A duplicate keeps shardwise's messages apart from the program's own use of MPI_COMM_WORLD.
    MPI_Comm dup;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    int size = 0;
    check_mpi(MPI_Comm_size(dup, &size), "MPI_Comm_size");
    std::vector<int> members(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) members[static_cast<size_t>(r)] = r;
    world = std::make_shared<MpiComm>(dup, std::move(members));
  });
  return world;
}

namespace {
[[noreturn]] void abort_job(int rank, const char* message) {
  if (rank < 0) {
    const char* env = std::getenv("OMPI_COMM_WORLD_RANK");
    if (!env) env = std::getenv("PMI_RANK");
    rank = env ? std::atoi(env) : 0;
  }
  // When every rank fails alike (a check all ranks make), one line is enough: the lowest failing
  // rank prints and aborts the job first, the others wait in proportion to their rank and are
  // usually ended by that abort before they print. A rank that fails alone still prints, late.
  // mpirun ends the others with SIGTERM: a handler of the program's (train's Ctrl-C) must not keep
  // a failing rank alive to print a second line.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  if (rank > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 * std::min(rank, 8)));
  std::fprintf(stderr, "shardwise: error: rank %d: %s\n", rank, message);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}
}  // namespace

int run_mpi_main(const std::function<void(Communicator&)>& fn) {
  int rank = -1;
  try {
    auto world = mpi_world();
    rank = world->rank();
    fn(*world);
  } catch (const std::exception& e) {
    abort_job(rank, e.what());
  } catch (...) {
    abort_job(rank, "an exception that is not a std::exception");
  }
  return 0;
}

}  // namespace shardwise::comm
