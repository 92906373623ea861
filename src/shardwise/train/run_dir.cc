#include "shardwise/train/run_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <tuple>

#include "shardwise/ckpt/commit.h"
#include "shardwise/core/error.h"

namespace shardwise::train {

namespace fs = std::filesystem;

std::string run_name(const std::string& config_file, const GptConfig& model) {
  const std::string kind = model.experts > 0 ? "mixtral" : model.model_type;
  std::string name = config_file.empty() ? kind : fs::path(config_file).stem().string();
  for (char& c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return name.empty() || name[0] == '.' ? "run" + name : name;
}

std::string claim_run_dir(const std::string& root, const std::string& name, std::time_t now) {
  std::error_code ec;
  fs::create_directories(root, ec);
  SW_CHECK(!ec, "cannot create the runs directory '{}': {}; pass --run-dir", root, ec.message());
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  const std::string base = (fs::path(root) / fmt::format("{}-{}", name, stamp)).string();
  for (int k = 1;; ++k) {
    std::string dir = k == 1 ? base : fmt::format("{}-{}", base, k);
    if (::mkdir(dir.c_str(), 0777) == 0) return dir;  // this run's alone: mkdir fails on one that exists
    SW_CHECK(errno == EEXIST, "cannot create the run directory '{}': {}; pass --run-dir", dir, std::strerror(errno));
  }
}

std::string point_latest(const std::string& root, const std::string& run_dir) {
  const fs::path link = fs::path(root) / "latest";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(link, ec)) && !fs::is_symlink(fs::symlink_status(link, ec)))
    return fmt::format("'{}' is not a symbolic link: left as it is (this run is {})", link.string(), run_dir);
  const fs::path tmp = fs::path(root) / fmt::format(".latest-{}", fs::path(run_dir).filename().string());
  fs::remove(tmp, ec);
  fs::create_directory_symlink(fs::path(run_dir).filename(), tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fmt::format("cannot point '{}' at {}", link.string(), run_dir);
  }
  return "";
}

std::optional<std::string> newest_run_with_checkpoint(const std::string& root, const std::string& name) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  // The name is matched literally: its characters are [A-Za-z0-9._-] (run_name), '.' escaped.
  std::string literal;
  for (char c : name) literal += c == '.' ? std::string("\\.") : std::string(1, c);
  const std::regex pattern(literal + "-([0-9]{8}-[0-9]{6})(?:-([0-9]+))?");
  std::optional<std::tuple<std::string, long, std::string>> best;  // stamp, k, directory
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (!e.is_directory() || e.is_symlink() || !std::regex_match(file, m, pattern)) continue;
    if (ckpt::list_checkpoints(e.path() / "checkpoints").empty()) continue;
    std::tuple<std::string, long, std::string> key{m[1].str(), m[2].matched ? std::stol(m[2].str()) : 1,
                                                   e.path().string()};
    if (!best || key > *best) best = key;
  }
  if (!best) return std::nullopt;
  return std::get<2>(*best);
}

}  // namespace shardwise::train
