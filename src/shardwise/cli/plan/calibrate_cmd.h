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
};
CLI::App* add_calibrate_command(CLI::App& app, CalibrateCliOptions& options);
int cmd_calibrate(const CalibrateCliOptions& options, std::ostream& out);

// This machine's cached calibration: an Error saying to run `shardwise calibrate` when there is
// none, when it was measured on another machine, or when the file is corrupt (naming the file and
// what is wrong).
nlohmann::json load_calibration_json();
plan::ClusterSpec load_calibration();

}  // namespace shardwise::cli
