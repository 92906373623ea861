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
  bool nothing_to_do = false;         // the checkpoint is at the run's last step already
};

// Collective. `resume`: "" (start fresh), "auto" (the newest checkpoint of `save_dir` that verifies,
// newer ones that fail set aside as "<name>.rejected") or a checkpoint directory (verified unless
// `verify` is false; Error naming its first problem). A checkpoint at the run's --steps leaves nothing
// to do (said in `lines`); one past it is an Error. When the run `saves`, a checkpoint of `save_dir`
// newer than the resumed step (which a save of this run would meet) is an Error before any step.
// `skip_optimizer` (--skip-optimizer): fresh AdamW moments at the saved step (load_trainer), said in
// `lines`.
ResumeResult resume_trainer(Trainer& trainer, comm::Communicator& world, const std::string& resume,
                            const ckpt::fs::path& save_dir, bool verify = true, bool saves = false,
                            bool skip_optimizer = false);

struct RunDirs {
  std::string run_dir, save_dir;
  bool saves = false;     // checkpoints will be written
  bool resuming = false;  // --resume given (auto or a directory)
  bool model_only = false;  // --save-model-only: the weights alone
};

// Collective, before the first step and before anything is written: the run directory (rank 0)
// and, when the run saves, the save directory (every rank) take a probe file; a save directory
// that already holds checkpoints needs `resuming`; the save directory's file system has room for
// one checkpoint (parameters x (weights + 2 Adam moments [+ fp32 masters]) x 4 bytes; the weights
// alone with `model_only`). Error on
// every rank naming the directory, the problem and what to do; returns warnings for rank 0.
std::vector<std::string> check_run_dirs(Trainer& trainer, comm::Communicator& world, const RunDirs& dirs);

// Bytes of one checkpoint of `trainer`, estimated from its parameter count.
uint64_t estimated_checkpoint_bytes(Trainer& trainer, comm::Communicator& world, bool model_only = false);

}  // namespace shardwise::train
