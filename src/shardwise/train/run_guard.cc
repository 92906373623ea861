#include "shardwise/train/run_guard.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>

#include "shardwise/comm/objects.h"

#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"
#include "shardwise/core/plural.h"
#include "shardwise/core/rank_failure.h"

namespace shardwise::train {
namespace {

// "" when `dir` can be created and takes a file; else why not.
std::string probe(const ckpt::fs::path& dir, int rank) {
  std::error_code ec;
  ckpt::fs::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create it: {}", ec.message());
  if (!ckpt::fs::is_directory(dir)) return "it is not a directory";
  ckpt::fs::path file = dir / fmt::format(".shardwise-probe-{}-{}", getpid(), rank);
  {
    std::ofstream f(file, std::ios::trunc);
    f << "probe\n";
    f.flush();
    if (!f.good()) return fmt::format("cannot write a file in it: {}", std::strerror(errno));
  }
  ckpt::fs::remove(file, ec);
  if (ec) return fmt::format("cannot remove a file from it: {}", ec.message());
  return "";
}

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// Rank 0's checks of the save directory: no checkpoints of another run, room for one checkpoint.
std::string check_save_dir(const RunDirs& dirs, uint64_t need, std::vector<std::string>& warnings) {
  auto existing = ckpt::list_checkpoints(dirs.save_dir);
  if (!existing.empty() && !dirs.resuming) {
    return fmt::format("save directory '{}' already holds {} (newest: {}): pass --resume auto to "
                       "continue that run, or choose another --run-dir / --save-dir; nothing was changed",
                       dirs.save_dir, counted(static_cast<int64_t>(existing.size()), "checkpoint"),
                       existing.back().dir.filename().string());
  }
  struct statvfs st {};
  if (statvfs(dirs.save_dir.c_str(), &st) != 0) return "";
  uint64_t free = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free < need) {
    return fmt::format("save directory '{}' has {} free but one checkpoint needs about {}: free space or choose "
                       "another --save-dir", dirs.save_dir, mib(free), mib(need));
  }
  if (free < 2 * need) {
    warnings.push_back(fmt::format("warning: save directory '{}' has {} free, room for only one checkpoint of about {}",
                                   dirs.save_dir, mib(free), mib(need)));
  }
  return "";
}

// Collective (rank 0 looks): Error when `dir` does not exist, naming the checkpoints its parent
// holds (rotation by --save-total-limit removes old ones) and how to resume one of them.
void check_exists(comm::Communicator& world, const ckpt::fs::path& dir) {
  std::string error;
  std::error_code ec;
  if (world.rank() == 0 && !ckpt::fs::exists(dir, ec)) {
    const ckpt::fs::path parent = dir.lexically_normal().parent_path().empty() ? "." : dir.lexically_normal().parent_path();
    std::vector<std::string> names;
    for (const auto& c : ckpt::list_checkpoints(parent)) names.push_back(c.dir.filename().string());
    error = names.empty()
                ? fmt::format("--resume {}: there is no such checkpoint, and '{}' holds none", dir.string(), parent.string())
                : fmt::format("--resume {}: there is no such checkpoint (--save-total-limit removes older ones); '{}' "
                              "holds {}: pass one of them, or --resume auto for the newest",
                              dir.string(), parent.string(), fmt::join(names, ", "));
  }
  error = comm::broadcast_object(world, error, 0).get<std::string>();
  if (!error.empty()) fail("{}", error);
}

}  // namespace

uint64_t estimated_checkpoint_bytes(Trainer& trainer, comm::Communicator& world, bool model_only) {
  nlohmann::json mine = nlohmann::json::object();
  for (const ParamState& p : trainer.params()) mine[p.name] = p.shape.numel();
  std::map<std::string, int64_t> all;  // with pp a rank holds only its stages' parameters
  for (const auto& rank : comm::all_gather_object(world, mine)) {
    for (const auto& [name, n] : rank.items()) all[name] = n.get<int64_t>();
  }
  uint64_t params = 0;
  for (const auto& [name, n] : all) params += static_cast<uint64_t>(n);
  // weights, exp_avg, exp_avg_sq [, masters]; a LoRA run saves its adapters only, in fp32.
  const uint64_t copies = model_only ? 1 : trainer.config().bf16 && !trainer.config().model.lora.enabled() ? 4 : 3;
  return params * copies * 4;
}

std::vector<std::string> check_run_dirs(Trainer& trainer, comm::Communicator& world, const RunDirs& dirs) {
  const uint64_t need = dirs.saves ? estimated_checkpoint_bytes(trainer, world, dirs.model_only) : 0;
  std::vector<std::string> warnings;
  std::string error;
  if (world.rank() == 0) {
    if (std::string why = probe(dirs.run_dir, 0); !why.empty()) {
      error = fmt::format("run directory '{}' is not usable: {}; choose another --run-dir", dirs.run_dir, why);
    }
  }
  if (error.empty() && dirs.saves) {
    if (std::string why = probe(dirs.save_dir, world.rank()); !why.empty()) {
      error = fmt::format("save directory '{}' is not usable: {}; choose another --save-dir", dirs.save_dir, why);
    }
  }
  if (error.empty() && world.rank() == 0 && (dirs.saves || ckpt::fs::is_directory(dirs.save_dir))) {
    error = check_save_dir(dirs, need, warnings);
  }
  // Every rank agrees: the first error (by rank) stops them all, naming that rank.
  const std::vector<nlohmann::json> all = comm::all_gather_object(world, error);
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].get<std::string>().empty()) throw RankFailure(static_cast<int64_t>(r), all[r].get<std::string>(), ErrorKind::Checkpoint);
  }
  return warnings;
}


ResumeResult resume_trainer(Trainer& trainer, comm::Communicator& world, const std::string& resume,
                            const ckpt::fs::path& save_dir, bool verify, bool saves, bool skip_optimizer) {
  ResumeResult r;
  if (resume.empty()) return r;
  if (resume == "auto") {
    auto found = ckpt::resume(world, save_dir, true, &r.lines);
    if (!found) {
      r.lines.push_back(fmt::format("resume: no verified checkpoint in {}, starting fresh", save_dir.string()));
      return r;
    }
    r.dir = found->dir;
  } else {
    r.dir = ckpt::fs::path(resume);
    check_exists(world, *r.dir);
    if (verify) {
      for (auto& n : ckpt::verify_resume_dir(world, *r.dir)) r.lines.push_back(fmt::format("{}: {}", resume, n));
    } else {
      r.lines.push_back(fmt::format("resume: {} loaded without verification (--no-verify-resume)", resume));
    }
  }
  load_trainer(trainer, world, *r.dir, skip_optimizer);
  r.lines.push_back(fmt::format("resumed from {} at step {} ({} samples consumed)", r.dir->string(),
                                trainer.steps_done(), trainer.consumed_samples()));
  if (skip_optimizer) {
    r.lines.push_back(fmt::format("--skip-optimizer: AdamW starts fresh at step {} (zero moments, bias correction "
                                  "from its first step){}", trainer.steps_done(),
                                  ckpt::GroupReader::exists(*r.dir, "optimizer") ? "; the checkpoint's moments are not read"
                                                                                 : ""));
  }
  const int64_t steps = trainer.config().optimizer.steps, at = trainer.steps_done();
  SW_CHECK(steps >= at, "--steps {} is below step {} of the resumed checkpoint {}: pass --steps above {} to train "
           "further, or resume an earlier checkpoint", steps, at, r.dir->string(), at);
  for (const auto& c : saves && steps > at ? ckpt::list_checkpoints(save_dir) : std::vector<ckpt::CheckpointEntry>{}) {
    SW_CHECK(c.step <= at || c.step > steps, "save directory '{}' holds {}, newer than the resumed step {}: this run "
             "would meet it when saving; resume the newest checkpoint (--resume auto), move {} away, or pass another "
             "--save-dir", save_dir.string(), c.dir.filename().string(), at, c.dir.string());
  }
  if (steps == at) {
    r.nothing_to_do = true;
    r.lines.push_back(fmt::format("nothing to do: {} is at step {}, which --steps {} asks for; pass a larger --steps "
                                  "to train further", r.dir->string(), at, steps));
  }
  return r;
}

}  // namespace shardwise::train
