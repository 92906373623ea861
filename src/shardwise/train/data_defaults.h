#pragma once
// Settings a --data run takes from its data when they are not given (the command line applies them:
// cli/train/data_defaults.h):
//   - the vocabulary: the tokenizer's size, or the token files' largest id + 1 (the validation
//     set's too), rounded up to a multiple of kVocabMultiple. Why 64: the vocab-parallel embedding
//     and cross-entropy split the vocabulary over tp, and a multiple of 64 divides evenly over any
//     tp up to 64 (powers of two) and gives the LM head's GEMM a width its kernels tile well (as
//     nanoGPT pads GPT-2's 50257 to 50304);
//   - the step count: a budget of tokens (--tokens N, or --epochs E passes over the training
//     tokens) divided by the tokens a step trains on (global batch x seq), rounded up.
#include <cstdint>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

inline constexpr int64_t kVocabMultiple = 64;
inline constexpr int64_t kDefaultFileSeq = 256;  // TrainConfig::check's sequence length for a file

// `needed` rounded up to a multiple of kVocabMultiple.
int64_t rounded_vocab(int64_t needed);

// The vocabulary `c`'s data needs: --tokenizer's vocabulary size, else the largest id of the
// training and validation tokens + 1. Opens the data files (not for a tokenizer). Error for the
// addition task (its vocabulary is the model's default) or data that cannot be read.
int64_t data_vocab(const TrainConfig& c);

// The training tokens of a checked `c` (the corpus less --val-fraction's held-out tail). Opens the data.
int64_t training_tokens(const TrainConfig& c);

// ceil(tokens / tokens_per_step), at least 1.
int64_t steps_for_tokens(double tokens, int64_t tokens_per_step);

}  // namespace shardwise::train
