#pragma once
// What a training run checks before its first step and how it resumes: the run and save
// directories are writable and have room for a checkpoint, a save directory that already holds
// checkpoints is only reused by a resumed run, and a resumed checkpoint verifies (or is set aside).
#include <optional>
#include <string>
#include <vector>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {

struct ResumeResult {
  std::optional<ckpt::fs::path> dir;  // the checkpoint loaded
  std::vector<std::string> lines;     // for rank 0 to print: rejected checkpoints, notes, what was loaded
};

// Collective. `resume`: "" (start fresh), "auto" (the newest checkpoint of `save_dir` that verifies,
// newer ones that fail set aside as "<name>.rejected") or a checkpoint directory (verified unless
// `verify` is false; Error naming its first problem).
ResumeResult resume_trainer(Trainer& trainer, comm::Communicator& world, const std::string& resume,
                            const ckpt::fs::path& save_dir, bool verify = true);

}  // namespace shardwise::train
