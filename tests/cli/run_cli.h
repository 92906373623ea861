#pragma once
// Runs the built `shardwise` binary (SHARDWISE_BIN) with arguments through the shell: exit status
// and stdout + stderr together.
#include <sys/wait.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace shardwise_cli_test {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

// A whole shell command line (stderr joins stdout).
inline Result run_command(const std::string& line) {
  std::string cmd = line + " 2>&1";
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) r.out.append(buf.data(), n);
  int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `shardwise <args>`.
inline Result run(const std::string& args) {
  const char* bin = std::getenv("SHARDWISE_BIN");
  return run_command(std::string(bin ? bin : "shardwise") + " " + args);
}

// `name` in this test binary's own scratch directory (tests/support/scratch_tmpdir.cc makes it
// TMPDIR), so two runs of the tests at once never share a run directory or a log.
inline std::string tmp(const std::string& name) { return (std::filesystem::temp_directory_path() / name).string(); }

// A scratch directory `name` (not created), emptied before the test and removed after it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) : path(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// metrics.jsonl's "loss" values by line, as written (text: compares bit for bit).
inline std::vector<std::string> metrics_losses(const std::filesystem::path& metrics) {
  std::vector<std::string> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const size_t at = line.find("\"loss\":") + 7;
    out.push_back(line.substr(at, line.find_first_of(",}", at) - at));
  }
  return out;
}

// GPT-2 with tied head: wte V*H + wpe S*H + per layer 12H^2 + 13H + the final LayerNorm 2H.
inline int64_t gpt2_parameters(int64_t layers, int64_t hidden, int64_t seq, int64_t vocab) {
  return vocab * hidden + seq * hidden + layers * (12 * hidden * hidden + 13 * hidden) + 2 * hidden;
}

inline int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace shardwise_cli_test
