#pragma once
// The trainer's unified checkpoints (layout in docs/architecture.md): model weights as Hugging Face indexed
// safetensors ("model"), AdamW moments ("optimizer": "<param>/exp_avg", "<param>/exp_avg_sq"),
// fp32 masters ("master_weights") only when the kernels read lower-precision copies, config.json,
// generation_config.json and trainer_state.json (step, consumed samples, schedule, data position,
// each rank's generator state and the saving mesh). Saved on one mesh, loaded on any other.
// A LoRA run saves what PEFT saves instead of the model: adapter_model.safetensors (one file, fp32,
// PEFT's keys) and adapter_config.json, plus the adapters' moments and trainer_state.json, which
// names the base model and its fingerprint (a resume refuses another base).
#include <memory>
#include <optional>

#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {

// What one checkpoint of `trainer` holds, with this rank's blocks (shared, not copied).
// `model_only` (--save-model-only): the model (or adapters), its json files, the tokenizer and
// trainer_state.json's position, without the "optimizer" and "master_weights" groups and the
// generators' state; trainer_state.json's optimizer.state_saved says which.
ckpt::CheckpointContent checkpoint_content(Trainer& trainer, comm::Communicator& world, bool model_only = false);

// Collective. Saves checkpoint-<step> under `root` now.
ckpt::fs::path save_trainer(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& root,
                            const ckpt::SaveOptions& options = {}, bool model_only = false);

// Collective. Loads `dir` into `trainer` (any saving mesh): parameters, moments, step and data
// position. Errors: a model configuration that differs (naming each field), missing or
// unexpected tensors (by name); for a LoRA run, other adapters (r, lora_alpha, targets ...) or
// another base model than the checkpoint's, and a whole-model checkpoint (or vice versa); a
// checkpoint without optimizer state (--save-model-only) unless `skip_optimizer`. With
// `skip_optimizer` (--skip-optimizer) the moments are not read: they start at zero at the saved step,
// AdamW's bias correction from t = 1 (Trainer::optimizer_steps), as a new optimizer's would.
void load_trainer(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir, bool skip_optimizer = false);

// Collective. Fine-tuning's start: the model weights of `dir` (a shardwise checkpoint, either
// layout, or a transformers `save_pretrained` directory: one model.safetensors or shards with an
// index) into `trainer`'s parameters on its mesh; moments, step and data position stay fresh.
// Parameters matching `ignore_keys` (globs of parameter names or file keys) keep their
// initialization. With LoRA the weights go to the frozen base. Records the directory and its
// fingerprint as the trainer's base model. Errors: a model configuration that differs (naming each
// field), missing or unexpected tensors (by name); returns how many of the directory's stored tensors
// this rank read (as the files name them: a fused c_attn counts once).
int64_t init_from_model(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir,
                        const std::vector<std::string>& ignore_keys = {});

// Collective. A LoRA run's start from a PEFT adapter directory (adapter_model.safetensors, PEFT's
// keys; a checkpoint of a LoRA run is one): the adapters' weights, on any mesh; moments, step and
// data position stay fresh. Error (prefixed "--lora-from DIR") naming missing or unexpected keys and
// a tensor of another shape (both shapes). Returns how many adapter tensors were loaded.
int64_t load_adapter(Trainer& trainer, comm::Communicator& world, const ckpt::fs::path& dir);

// Saves on a schedule during training, synchronously or in the background.
class CheckpointSchedule {
 public:
  CheckpointSchedule(ckpt::fs::path root, int64_t every, bool async, ckpt::SaveOptions options,
                     bool model_only = false);
  // Saves when the trainer's step is a multiple of `every` (or `force`); returns the directory
  // of a synchronous save.
  std::optional<ckpt::fs::path> after_step(Trainer& trainer, comm::Communicator& world, bool force = false);
  // Waits for a background save; raises its error.
  std::optional<ckpt::fs::path> finish();

  // The saves made so far and how long training stood still for them (a whole save, or an async
  // save's copy into host buffers): in total and the longest.
  struct Stalls {
    int64_t saves = 0;
    double total_s = 0, longest_s = 0;
  };
  const Stalls& stalls() const { return stalls_; }
  bool async() const { return async_ != nullptr; }

 private:
  ckpt::fs::path root_;
  int64_t every_;
  ckpt::SaveOptions options_;
  bool model_only_ = false;
  std::unique_ptr<ckpt::AsyncSaver> async_;
  Stalls stalls_;
};

}  // namespace shardwise::train
