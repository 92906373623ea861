#pragma once
// The model's weights on disk, apart from a training run: its configuration read from a directory's
// config.json (a shardwise checkpoint, old or new layout, or a transformers GPT-2 `save_pretrained`
// directory) and its weights loaded, for any layout, under the model's own parameter names (the
// file keys and fused tensors are the key map's business, not the caller's). Used by --init-from,
// generation and LoRA.
#include <map>
#include <span>
#include <string>
#include <vector>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/train/gpt.h"

namespace shardwise::train {

// The model configuration of `dir`'s config.json. Error naming the directory and the field when it
// is not a GPT-2 configuration shardwise can build.
GptConfig read_model_config(const ckpt::fs::path& dir);

// This process's blocks of the model weights `specs` asks for (the model's parameter names, f32),
// from the fp32 masters when the checkpoint has them, else the weights (converted to f32). Keys
// matching `ignore_keys` (globs of parameter names) may be missing or unexpected.
std::map<std::string, Tensor> load_model_weights(const ckpt::fs::path& dir, const GptConfig& config,
                                                 std::span<const ckpt::LoadSpec> specs, int64_t process,
                                                 const std::vector<std::string>& ignore_keys = {});

}  // namespace shardwise::train
