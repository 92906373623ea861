#pragma once
// Where a run's files go when no --run-dir is given: a directory of its own per run,
// <root>/<name>-<YYYYmmdd-HHMMSS>, with -2, -3, ... when a run of that name started in the same
// second. The directory is claimed with one mkdir, so two runs never share one, and <root>/latest
// points to the newest. Plain file-system calls: the CLI runs them on rank 0 and broadcasts.
#include <ctime>
#include <optional>
#include <string>

#include "shardwise/models/gpt.h"

namespace shardwise::train {

inline constexpr const char* kRunsRoot = "runs";  // where a run without --run-dir gets a directory of its own

// The name of a run: its config file's stem ("demo" for examples/demo.toml), else the model's kind
// (gpt2, llama, mixtral for a Llama with experts); any character outside [A-Za-z0-9._-] becomes '_'.
std::string run_name(const std::string& config_file, const GptConfig& model);

// Creates and returns <root>/<name>-<stamp of `now` in local time>, or the first -2, -3, ... of it
// that no other run took. Error naming the directory when it cannot be created.
std::string claim_run_dir(const std::string& root, const std::string& name, std::time_t now);

// Points <root>/latest at `run_dir` (a relative symbolic link, replaced atomically). Returns "" or a
// warning when it cannot (a file or directory named latest that is not such a link is left alone).
std::string point_latest(const std::string& root, const std::string& run_dir);

// The newest run directory <root>/<name>-<stamp>[-k] (by stamp, then k) whose checkpoints/ holds a
// checkpoint; nullopt when there is none.
std::optional<std::string> newest_run_with_checkpoint(const std::string& root, const std::string& name);

}  // namespace shardwise::train
