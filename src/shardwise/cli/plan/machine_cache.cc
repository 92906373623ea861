#include "shardwise/cli/plan/machine_cache.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>

#include "shardwise/core/atomic_file.h"

namespace shardwise::cli {

std::filesystem::path machine_cache_path(const std::string& file) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path base = xdg && *xdg ? xdg : std::filesystem::path(home ? home : "/tmp") / ".cache";
  return base / "shardwise" / file;
}

std::string machine_cache_key() {
  std::ifstream cpu("/proc/cpuinfo");
  std::string line, key;
  for (int seen = 0; seen < 5 && std::getline(cpu, line);) {
    for (const char* f : {"model name", "cpu family", "model\t", "stepping", "flags"}) {
      if (line.rfind(f, 0) != 0) continue;
      auto v = line.substr(line.find(':') + 1);
      key += f == std::string("flags") ? fmt::format("flags#{:x};", std::hash<std::string>{}(v)) : v + ";";
      ++seen;
    }
  }
  for (const char* lib : {"libopenblas.so.0", "libblis.so.4", "libdnnl.so.2"}) {
    for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"}) {
      struct stat st {};
      if (stat(fmt::format("{}/{}", dir, lib).c_str(), &st) == 0) {
        key += fmt::format("{}:{}:{};", lib, st.st_size, st.st_mtime);
        break;
      }
    }
  }
  return key;
}

void write_machine_cache(const std::filesystem::path& path, const std::string& text, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const std::string problem = write_file_atomically(path, text);
  if (!problem.empty()) std::cerr << fmt::format("shardwise: warning: cannot write the {} {}: {}\n", what, path.string(), problem);
}

}  // namespace shardwise::cli
