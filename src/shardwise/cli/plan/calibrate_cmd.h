#pragma once
// `shardwise calibrate`: measures this machine for the step-time model (plan/calibrate.h) and caches
// it as a cluster description in $XDG_CACHE_HOME/shardwise/calibration.json, keyed by the machine
// like gemm-check's choice (cli/machine_cache.h).
#include <CLI/CLI.hpp>
#include <ostream>

#include "shardwise/plan/cluster.h"

namespace shardwise::cli {

struct CalibrateCliOptions {
  bool quick = false;
  int ranks = 2;
  bool show = false;  // print the cached calibration, measure nothing
  bool json = false;
  // after measuring, measure MPI's collectives too: runs `mpirun -np <ranks>` of this program's
  // `calibrate`, which (under mpirun) adds them to the cached calibration
  bool mpi = false;
};
CLI::App* add_calibrate_command(CLI::App& app, CalibrateCliOptions& options);
int cmd_calibrate(const CalibrateCliOptions& options, std::ostream& out);

// This machine's cached calibration: an Error saying to run `shardwise calibrate` when there is
// none, when it was measured on another machine, or when the file is corrupt (naming the file and
// what is wrong).
nlohmann::json load_calibration_json();
// With `mpi`, the collectives measured between MPI processes (plan::for_backend; an Error saying to
// run `shardwise calibrate --mpi` when `require_mpi` and there are none).
plan::ClusterSpec load_calibration(bool mpi = false, bool require_mpi = false);

// The backend a prediction on this machine is for: --backend's "threads" or "mpi", "auto": mpi
// under mpirun.
bool predicts_mpi(const std::string& backend);

}  // namespace shardwise::cli
