#include "shardwise/cli/train/data_defaults.h"

#include "shardwise/core/error.h"
#include "shardwise/train/data_defaults.h"

namespace shardwise::cli {

namespace {

// "2.4M", "51.2k", "900".
std::string count_text(double n) {
  if (n >= 1e9) return fmt::format("{:.3g}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.3g}M", n / 1e6);
  if (n >= 1e4) return fmt::format("{:.3g}k", n / 1e3);
  return fmt::format("{}", static_cast<int64_t>(n));
}

}  // namespace

std::vector<std::string> apply_data_defaults(const TrainOptions& o, train::TrainConfig& c, int64_t ranks) {
  const bool budget = o.epochs != 0 || o.tokens != 0;
  SW_CHECK(!budget || !c.data.files.empty(), "{} sets the steps from --data's size: the embedded addition task has no size "
           "(give --steps)", o.epochs != 0 ? "--epochs" : "--tokens");
  SW_CHECK(!(o.epochs != 0 && o.tokens != 0), "--epochs {} and --tokens {} both set the run's length: give one",
           o.epochs, o.tokens);
  SW_CHECK(!budget || !o.steps_given, "--steps {} and {} both set the run's length: give one", c.optimizer.steps,
           o.epochs != 0 ? "--epochs" : "--tokens");
  SW_CHECK(o.epochs >= 0 && o.tokens >= 0, "{} must be positive, got {}", o.epochs < 0 ? "--epochs" : "--tokens",
           o.epochs < 0 ? o.epochs : static_cast<double>(o.tokens));
  std::vector<std::string> lines;
  if (c.data.files.empty()) return lines;
  if (!o.vocab_given) {
    const int64_t needed = train::data_vocab(c);
    c.model.vocab = train::rounded_vocab(needed);
    lines.push_back(fmt::format("vocab {}: {} {} ids, rounded up to a multiple of {} (--vocab sets it)", c.model.vocab,
                                c.data.tokenizer.empty() ? "the data needs" : "the tokenizer has", needed,
                                train::kVocabMultiple));
  }
  if (o.steps_given) return lines;
  train::TrainConfig probe = c;
  probe.check(ranks, false);  // the sequence length and the global batch
  const int64_t per_step = probe.optimizer.global_batch * probe.model.seq;
  const double tokens = static_cast<double>(train::training_tokens(probe));
  const double epochs = o.epochs != 0 ? o.epochs : 1;
  const double wanted = o.tokens != 0 ? static_cast<double>(o.tokens) : epochs * tokens;
  c.optimizer.steps = train::steps_for_tokens(wanted, per_step);
  const std::string why = o.tokens != 0 ? fmt::format("--tokens {}", count_text(wanted))
                          : o.epochs != 0 ? fmt::format("--epochs {} of {} training tokens", epochs, count_text(tokens))
                                          : fmt::format("one epoch of {} training tokens", count_text(tokens));
  lines.push_back(fmt::format("steps {}: {} at {} tokens a step (global batch {} x seq {}){}", c.optimizer.steps, why,
                              count_text(static_cast<double>(per_step)), probe.optimizer.global_batch, probe.model.seq,
                              budget ? "" : "; --steps, --epochs or --tokens sets the length"));
  return lines;
}

}  // namespace shardwise::cli
