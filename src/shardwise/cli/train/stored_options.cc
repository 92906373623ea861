#include "shardwise/cli/train/stored_options.h"

#include <algorithm>
#include <set>

#include "shardwise/ckpt/commit.h"
#include "shardwise/core/error.h"
#include "shardwise/train/run_dir.h"
#include "shardwise/train/run_options.h"

namespace shardwise::cli {

namespace {

// Options that describe one invocation (or one machine), not the run: never stored, never restored.
bool per_invocation(const std::string& name) {
  static const std::set<std::string> names = {"help",       "resume", "config",       "dry-run", "json",
                                              "no-verify-resume", "skip-optimizer", "ranks", "gemm", "device", "memory-limit"};
  return names.count(name) > 0;
}

std::string long_name(const CLI::Option& opt) {
  return opt.get_lnames().empty() ? std::string() : opt.get_lnames().front();
}

std::string shown(const std::vector<std::string>& values) {
  return values.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(values, ","));
}

// The checkpoint whose options a --resume takes: the directory given, or for `auto` the newest
// checkpoint of the save directory that has run_options.json (none: nothing to take).
std::optional<ckpt::fs::path> resumed_dir(const TrainOptions& o) {
  if (o.checkpoint.resume != "auto") {
    if (ckpt::fs::is_directory(o.checkpoint.resume)) return ckpt::fs::path(o.checkpoint.resume);
    return std::nullopt;  // the resume itself says what is wrong with it
  }
  // Where train_cmd's choose_run_dir looks: --save-dir, --run-dir, else the newest run of this name.
  std::string save_dir = o.checkpoint.save_dir;
  if (save_dir.empty() && !o.logging.run_dir.empty()) save_dir = o.logging.run_dir + "/checkpoints";
  if (save_dir.empty()) {
    const auto run =
        train::newest_run_with_checkpoint(train::kRunsRoot, train::run_name(o.config_file, o.config.model));
    if (!run) return std::nullopt;
    save_dir = *run + "/checkpoints";
  }
  std::vector<ckpt::CheckpointEntry> all = ckpt::list_checkpoints(save_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (ckpt::fs::exists(it->dir / train::kRunOptionsFile)) return it->dir;
  return std::nullopt;
}

}  // namespace

nlohmann::json stored_run_options(const CLI::App& cmd) {
  nlohmann::json out = nlohmann::json::object();
  for (const CLI::Option* opt : cmd.get_options()) {
    const std::string name = long_name(*opt);
    if (name.empty() || per_invocation(name) || opt->count() == 0) continue;
    out[name] = opt->results();
  }
  return out;
}

std::vector<std::string> apply_stored_options(CLI::App& cmd, const TrainOptions& o) {
  if (o.checkpoint.resume.empty()) return {};
  const std::optional<ckpt::fs::path> dir = resumed_dir(o);
  if (!dir) return {};
  const std::optional<nlohmann::json> stored = train::read_run_options(*dir);
  if (!stored) return {};
  const std::string file = (*dir / train::kRunOptionsFile).string();
  std::vector<std::string> taken, overrides;
  // Given again: named when the value differs from the checkpoint's (its stored value, or the
  // default it ran with when it was not given).
  for (CLI::Option* opt : cmd.get_options()) {
    const std::string name = long_name(*opt);
    if (name.empty() || per_invocation(name) || opt->count() == 0) continue;
    const std::vector<std::string> now = opt->results();
    const bool was_given = stored->contains(name);
    const std::vector<std::string> then =
        was_given ? (*stored)[name].get<std::vector<std::string>>() : std::vector<std::string>{opt->get_default_str()};
    if (now != then)
      overrides.push_back(fmt::format("--{} {} overrides the checkpoint's {}{}", name, shown(now), shown(then),
                                      was_given ? "" : " (the default)"));
  }
  for (const auto& [name, values] : stored->items()) {
    if (per_invocation(name)) continue;
    CLI::Option* opt = nullptr;
    try {
      opt = cmd.get_option("--" + name);
    } catch (const CLI::Error&) {
    }
    SW_CHECK(opt != nullptr, "{} stores the option --{}, which this shardwise does not know: resume with a "
             "shardwise that does, or remove the key from the file", file, name);
    if (opt->count() > 0) continue;  // given again: it wins
    const auto v = values.get<std::vector<std::string>>();
    SW_CHECK(name != "tokenizer" || v.empty() || ckpt::fs::exists(v.front()),
             "the --tokenizer {} that {} was trained with is gone: give --tokenizer again (the checkpoint holds a copy: "
             "{})", shown(v), dir->filename().string(), (*dir / train::kTokenizerFile).string());
    try {
      opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      fail("{}: option --{} {}: {}", file, name, shown(v), e.what());
    }
    taken.push_back(fmt::format("--{} {}", name, shown(v)));
  }
  std::vector<std::string> lines;
  if (!taken.empty())
    lines.push_back(fmt::format("options from {}: {}", file, fmt::join(taken, " ")));
  if (!overrides.empty()) lines.push_back(fmt::format("{}", fmt::join(overrides, "; ")));
  return lines;
}

}  // namespace shardwise::cli
