#include "shardwise/core/atomic_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

namespace shardwise {

std::string write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.parent_path() / fmt::format(".{}.{}.tmp", path.filename().string(), getpid());
  std::error_code ec;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::filesystem::remove(tmp, ec);
      return fmt::format("cannot write '{}'", tmp.string());
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (!ec) return "";
  std::string problem = fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), path.string(), ec.message());
  std::filesystem::remove(tmp, ec);
  return problem;
}

}  // namespace shardwise
