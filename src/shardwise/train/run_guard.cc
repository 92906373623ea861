#include "shardwise/train/run_guard.h"

#include "shardwise/ckpt/commit.h"
#include "shardwise/core/error.h"
#include "shardwise/train/checkpointing.h"

namespace shardwise::train {

ResumeResult resume_trainer(Trainer& trainer, comm::Communicator& world, const std::string& resume,
                            const ckpt::fs::path& save_dir, bool verify) {
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
    if (verify) {
      for (auto& n : ckpt::verify_resume_dir(world, *r.dir)) r.lines.push_back(fmt::format("{}: {}", resume, n));
    } else {
      r.lines.push_back(fmt::format("resume: {} loaded without verification (--no-verify-resume)", resume));
    }
  }
  load_trainer(trainer, world, *r.dir);
  r.lines.push_back(fmt::format("resumed from {} at step {} ({} samples consumed)", r.dir->string(),
                                trainer.steps_done(), trainer.consumed_samples()));
  return r;
}

}  // namespace shardwise::train
