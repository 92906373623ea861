#pragma once
// Stopping `shardwise train` with Ctrl-C (SIGINT) or SIGTERM: the first signal asks the run to stop
// after the step it is in (every rank agrees on that step), the second exits at once with status 130.
#include <string>
#include <vector>

#include "shardwise/comm/communicator.h"

namespace shardwise::cli {

inline constexpr int kInterruptedExit = 130;  // 128 + SIGINT, what a shell reports for Ctrl-C

// While it lives, SIGINT and SIGTERM set this process's stop request (the first one) and end the
// process with status 130 (the same signal again; the other one after the first is ignored, since
// mpirun answers a Ctrl-C with a SIGTERM to every process); the handlers before it come back when it
// ends, and the stop request with them. `say`: the
// first signal prints one line on stderr (one process of an MPI job says it, not every rank).
class StopSignals {
 public:
  explicit StopSignals(bool say);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The signal that asked this process to stop (SIGINT or SIGTERM), 0 when none has.
int stop_signal();

// Asks this process's run to stop after its step, as a first `sig` caught by StopSignals does (no
// message, no handler): the Python package's Trainer, whose interpreter caught the signal, asks so.
// A stop already asked for stays.
void request_stop(int sig);

// Forgets the stop request and the agreed stop: a later run in this process starts without them
// (StopSignals does the same when it begins and ends).
void clear_stop();

// Collective: whether any rank's process was asked to stop: the signal (SIGINT when any process got
// it: the user's Ctrl-C rather than mpirun's SIGTERM) or 0, the same on every rank, so they all stop
// after the same step.
// A signal agreed on is kept for agreed_stop().
int agree_to_stop(comm::Communicator& world);

// The signal a run of this process agreed to stop on (0: none since StopSignals began).
int agreed_stop();

// "SIGINT", "SIGTERM" or "signal N".
std::string signal_name(int sig);

// The command line that continues the run in `run_dir` from its newest checkpoint: `argv` (the
// program and its arguments as given) without --resume and --run-dir, then --run-dir `run_dir`
// --resume auto; `mpi_ranks` > 0 puts `mpirun -np N` in front. Arguments the shell would split or
// expand are single-quoted.
std::string resume_command(const std::vector<std::string>& argv, const std::string& run_dir, int mpi_ranks);

}  // namespace shardwise::cli
