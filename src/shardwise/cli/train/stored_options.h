#pragma once
// A run's options in its checkpoints (train/run_options.h) and back: what `train` records, and the
// defaults a `--resume` takes from the checkpoint it resumes.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardwise/cli/commands.h"

namespace shardwise::cli {

// The options of `cmd` that were given (on the command line, in --config, or taken from a
// checkpoint), by long name: {"lr": ["0.002"], ...}. Leaves out what describes this invocation
// rather than the run: --resume, --config, --dry-run, --json, --no-verify-resume, and the machine's
// --ranks, --gemm, --device and --memory-limit (a checkpoint loads on any device).
nlohmann::json stored_run_options(const CLI::App& cmd);

// --resume: the options stored in the checkpoint it names (--resume DIR, or for --resume auto the
// newest checkpoint of the save directory) become the defaults: each option not given again takes
// the stored value. Returns the lines to print: what came from the checkpoint, and each option given
// again with another value ("--lr 0.001 overrides the checkpoint's 0.002"). Nothing for a checkpoint
// without run_options.json. Error (naming the file) for an unreadable one or a stored option that
// this shardwise does not know.
std::vector<std::string> apply_stored_options(CLI::App& cmd, const TrainOptions& options);

}  // namespace shardwise::cli
