#include "shardwise/train/data_defaults.h"

#include <algorithm>
#include <cmath>

#include "shardwise/core/error.h"
#include "shardwise/data/tokenizer.h"

namespace shardwise::train {

int64_t rounded_vocab(int64_t needed) {
  SW_CHECK(needed >= 1, "a vocabulary needs at least 1 token, got {}", needed);
  return (needed + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
}

int64_t data_vocab(const TrainConfig& c) {
  SW_CHECK(!c.data.files.empty(), "the embedded addition task has no data files to take a vocabulary from");
  if (!c.data.tokenizer.empty()) return Tokenizer(c.data.tokenizer).vocab_size();
  TrainConfig probe = c;
  if (probe.model.seq == 0) probe.model.seq = kDefaultFileSeq;
  int64_t needed = open_training_data(probe)->vocab_needed();
  if (const auto val = open_validation_data(probe)) needed = std::max(needed, val->vocab_needed());
  return needed;
}

int64_t training_tokens(const TrainConfig& c) {
  const auto data = open_training_data(c);
  const auto* file = dynamic_cast<const TokenFile*>(data.get());
  SW_CHECK(file != nullptr, "the embedded addition task has no token count (it draws problems without end)");
  return file->token_count();
}

int64_t steps_for_tokens(double tokens, int64_t tokens_per_step) {
  SW_CHECK(tokens_per_step >= 1, "a step trains on at least 1 token, got {}", tokens_per_step);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(tokens / static_cast<double>(tokens_per_step))));
}

}  // namespace shardwise::train
