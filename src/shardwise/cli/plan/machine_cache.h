#pragma once
// Where `shardwise gemm-check` and `shardwise calibrate` cache what they measured on this machine:
// $XDG_CACHE_HOME/shardwise/<file> (default ~/.cache), keyed by the machine: a file measured on
// another CPU or with other GEMM libraries does not count.
#include <filesystem>
#include <string>

namespace shardwise::cli {

std::filesystem::path machine_cache_path(const std::string& file);
// The CPU (model name, family, model, stepping, flags) and each candidate GEMM library file's size
// and modification time: a new CPU or an upgraded library measures again.
std::string machine_cache_key();
// Writes `text` to `path` atomically (a concurrent reader sees the old or the new file); a failure
// is a warning on stderr naming `what`.
void write_machine_cache(const std::filesystem::path& path, const std::string& text, const std::string& what);

}  // namespace shardwise::cli
