#pragma once
// What a checkpoint keeps of the run that wrote it beyond the model and the optimizer, so that a
// resume and `shardwise generate` need no repeated flags:
//   - run_options.json: the options the run was given (on the command line or in --config), as
//     {"options": {"<long option name>": ["value", ...]}}; a resume takes them as its defaults;
//   - tokenizer.model: a --tokenizer run's SentencePiece model, byte for byte (what transformers'
//     LlamaTokenizer reads), with a tokenizer_config.json naming that class and the special tokens;
//   - else the tokenizer files of the --init-from model directory (ckpt::kTokenizerFiles), byte for
//     byte, so that the checkpoint is usable alone (AutoTokenizer.from_pretrained, generate).
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {

inline constexpr const char* kRunOptionsFile = "run_options.json";
inline constexpr const char* kTokenizerFile = "tokenizer.model";

// Adds run_options.json (when `options` is an object) and the tokenizer's files to a checkpoint's
// content: a --tokenizer run's, else those of `model_dir` (the --init-from directory; "" for none).
void add_run_files(const TrainConfig& c, const nlohmann::json& options, const std::string& model_dir,
                   ckpt::CheckpointContent& content);

// The options stored in checkpoint `dir` ({"name": ["value", ...]}); nullopt for a checkpoint
// without run_options.json (written before it, or not by `shardwise train`). Error naming the file
// when it is not the JSON described above.
std::optional<nlohmann::json> read_run_options(const ckpt::fs::path& dir);

// `dir`/tokenizer.model when the checkpoint (or model directory) holds one.
std::optional<std::string> stored_tokenizer(const ckpt::fs::path& dir);

}  // namespace shardwise::train
