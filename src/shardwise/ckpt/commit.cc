#include "shardwise/ckpt/commit.h"

#include <algorithm>
#include <charconv>
#include <functional>

#include "shardwise/ckpt/manifest.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

constexpr std::string_view kPrefix = "checkpoint-";

std::optional<int64_t> parse_step(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || p != digits.data() + digits.size() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) { return fmt::format("{}{}", kPrefix, step); }

std::optional<int64_t> parse_checkpoint_dir(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  return parse_step(name.substr(kPrefix.size()));
}

std::vector<CheckpointEntry> list_checkpoints(const fs::path& root) {
  std::vector<CheckpointEntry> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    if (auto step = parse_checkpoint_dir(e.path().filename().string())) out.push_back({*step, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

fs::path begin_commit(const fs::path& root, int64_t step) {
  SW_CHECK(step >= 0, "checkpoint step must be >= 0, got {}", step);
  fs::create_directories(root);
  fs::path final_dir = root / checkpoint_dir_name(step);
  SW_CHECK(!fs::exists(final_dir), "'{}' already exists: a checkpoint is never overwritten (save under another step "
           "or remove it first)", final_dir.string());
  fs::path tmp = root / (checkpoint_dir_name(step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  return tmp;
}

fs::path finish_commit(const fs::path& root, int64_t step) {
  fs::path tmp = root / (checkpoint_dir_name(step) + ".tmp");
  fs::path final_dir = root / checkpoint_dir_name(step);
  fsync_dir(tmp);
  rename_path(tmp, final_dir);
  fsync_dir(root);
  write_file_atomic(root / "latest", checkpoint_dir_name(step) + "\n");
  return final_dir;
}

std::vector<int64_t> rotate_checkpoints(const fs::path& root, int64_t newest_verified_step, int64_t limit) {
  std::vector<int64_t> deleted;
  if (limit <= 0) return deleted;
  std::vector<CheckpointEntry> eligible;
  for (auto& c : list_checkpoints(root)) {
    if (c.step <= newest_verified_step) eligible.push_back(c);
  }
  for (size_t i = 0; i + static_cast<size_t>(limit) < eligible.size(); ++i) {
    // Renamed first so an interrupted delete never leaves a half checkpoint under a valid name.
    fs::path doomed = root / (checkpoint_dir_name(eligible[i].step) + ".deleted");
    fs::remove_all(doomed);
    rename_path(eligible[i].dir, doomed);
    fs::remove_all(doomed);
    deleted.push_back(eligible[i].step);
  }
  if (!deleted.empty()) fsync_dir(root);
  return deleted;
}

std::vector<fs::path> clean_stale(const fs::path& root) {
  std::vector<fs::path> removed;
  if (!fs::is_directory(root)) return removed;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (name.substr(0, kPrefix.size()) != kPrefix) continue;
    for (std::string_view suffix : {".tmp", ".deleted"}) {
      if (name.size() > suffix.size() && name.ends_with(suffix) &&
          parse_step(std::string_view(name).substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size()))) {
        removed.push_back(e.path());
      }
    }
  }
  for (const auto& p : removed) fs::remove_all(p);
  return removed;
}

std::optional<CheckpointEntry> find_resume(const fs::path& root, bool checksums, std::vector<std::string>* rejected,
                                           std::vector<std::string>* notes) {
  clean_stale(root);
  auto all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    VerifyReport r = verify_checkpoint(it->dir, checksums);
    SW_CHECK(!r.newer_version, "{} was written by a newer shardwise ({}): nothing was set aside; resume it with that "
             "version, or an older checkpoint with --resume DIR", it->dir.filename().string(), r.problems.front());
    if (r.ok() && r.step == it->step) {
      if (notes) {
        for (const auto& n : r.notes) notes->push_back(fmt::format("{}: {}", it->dir.filename().string(), n));
      }
      return *it;
    }
    if (rejected) {
      std::string why = r.ok() ? fmt::format("manifest says step {}", r.step) : r.problems.front();
      if (r.problems.size() > 1) why += fmt::format(" (and {} more problem(s))", r.problems.size() - 1);
      rejected->push_back(fmt::format("{}: {}", it->dir.filename().string(), why));
    }
  }
  return std::nullopt;
}

fs::path set_aside(const fs::path& dir) {
  fs::path target = dir.string() + ".rejected";
  for (int n = 1; fs::exists(target); ++n) target = fmt::format("{}.rejected.{}", dir.string(), n);
  rename_path(dir, target);
  fsync_dir(dir.parent_path());
  return target;
}

namespace {

// Rank 0 computes a JSON answer (an exception becomes {"error": ...}); every rank gets it.
nlohmann::json decided_by_rank0(comm::Communicator& comm, const std::function<nlohmann::json()>& decide) {
  nlohmann::json answer;
  if (comm.rank() == 0) {
    try {
      answer = decide();
    } catch (const std::exception& e) {
      answer = {{"error", e.what()}};
    }
  }
  return comm::broadcast_object(comm, answer, 0);
}

}  // namespace

std::optional<CheckpointEntry> resume(comm::Communicator& comm, const fs::path& root, bool checksums,
                                      std::vector<std::string>* messages) {
  nlohmann::json answer = decided_by_rank0(comm, [&] {
    std::vector<std::string> rejected, notes, lines;
    auto found = find_resume(root, checksums, &rejected, &notes);
    // Every checkpoint newer than the one taken failed: set aside, in the order find_resume saw them.
    size_t i = 0;
    auto all = list_checkpoints(root);
    for (auto it = all.rbegin(); it != all.rend() && (!found || it->step > found->step); ++it, ++i) {
      fs::path moved = set_aside(it->dir);
      lines.push_back(fmt::format("rejected {}; moved to {}", i < rejected.size() ? rejected[i] : it->dir.string(),
                                  moved.filename().string()));
    }
    for (const auto& n : notes) lines.push_back(n);
    nlohmann::json a = {{"messages", lines}};
    if (found) a["step"] = found->step, a["dir"] = found->dir.string();
    return a;
  });
  if (answer.contains("error")) fail("resume from '{}': {}", root.string(), answer["error"].get<std::string>());
  if (messages) *messages = answer["messages"].get<std::vector<std::string>>();
  if (!answer.contains("step")) return std::nullopt;
  return CheckpointEntry{answer["step"].get<int64_t>(), fs::path(answer["dir"].get<std::string>())};
}

std::vector<std::string> verify_resume_dir(comm::Communicator& comm, const fs::path& dir, bool checksums) {
  nlohmann::json answer = decided_by_rank0(comm, [&] {
    VerifyReport r = verify_checkpoint(dir, checksums);
    if (!r.ok()) {
      return nlohmann::json{{"error", fmt::format("checkpoint '{}' does not verify: {}{}; pass --no-verify-resume to "
                                                  "load it anyway", dir.string(), r.problems.front(),
                                                  r.problems.size() > 1 ? fmt::format(" (and {} more problem(s))",
                                                                                      r.problems.size() - 1) : "")}};
    }
    return nlohmann::json{{"notes", r.notes}};
  });
  if (answer.contains("error")) fail("{}", answer["error"].get<std::string>());
  return answer["notes"].get<std::vector<std::string>>();
}

}  // namespace shardwise::ckpt
