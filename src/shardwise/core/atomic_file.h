#pragma once
// A whole file written so that a reader sees the old file or all of the new one, never part of it:
// the bytes go to a temporary in the same directory (named for this process, so processes writing
// the same file do not share one), which is then renamed over `path`.
#include <filesystem>
#include <string>
#include <string_view>

namespace shardwise {

// "" when done; else the reason, and the temporary is removed (a short write is never renamed).
std::string write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace shardwise
