#include "shardwise/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <unordered_map>

#include "shardwise/core/error.h"

namespace shardwise::train {

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::error_code ec;
  SW_CHECK(std::filesystem::is_regular_file(model_path, ec),
           "--tokenizer '{}': no such file (a SentencePiece tokenizer.model; `shardwise tokenize --train-model` "
           "trains one)",
           model_path);
  const sentencepiece::util::Status status = sp_->Load(model_path);
  SW_CHECK(status.ok(), "--tokenizer '{}' is not a SentencePiece model: {}", model_path, status.ToString());
  vocab_ = sp_->GetPieceSize();
  SW_CHECK(vocab_ >= 1, "--tokenizer '{}' holds an empty vocabulary", model_path);
  bos_ = sp_->bos_id(), eos_ = sp_->eos_id(), pad_ = sp_->pad_id(), unk_ = sp_->unk_id();
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int64_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const sentencepiece::util::Status status = sp_->Encode(text, &ids);
  SW_CHECK(status.ok(), "tokenizer '{}' cannot encode a text of {} bytes: {}", path_, text.size(), status.ToString());
  return {ids.begin(), ids.end()};
}

void Tokenizer::check_id(int64_t id) const {
  SW_CHECK(id >= 0 && id < vocab_, "token id {} is outside the vocabulary of tokenizer '{}' (ids 0 to {})", id, path_,
           vocab_ - 1);
}

std::string Tokenizer::decode(std::span<const int64_t> ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (int64_t id : ids) {
    check_id(id);
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const sentencepiece::util::Status status = sp_->Decode(narrow, &text);
  SW_CHECK(status.ok(), "tokenizer '{}' cannot decode {} ids: {}", path_, ids.size(), status.ToString());
  return text;
}

std::string Tokenizer::piece(int64_t id) const {
  check_id(id);
  return sp_->IdToPiece(static_cast<int>(id));
}

std::string Tokenizer::describe() const {
  auto id = [](int64_t v) { return v < 0 ? std::string("none") : std::to_string(v); };
  return fmt::format("{} (SentencePiece, vocabulary {}, bos {}, eos {})", path_, vocab_, id(bos_), id(eos_));
}

std::string train_tokenizer(const TokenizerTraining& o) {
  SW_CHECK(!o.inputs.empty(), "--train-model needs --in: the text files to train the tokenizer on");
  SW_CHECK(!o.model_prefix.empty(), "--train-model needs --model-prefix P: the model is written to P.model");
  SW_CHECK(o.model_type == "bpe" || o.model_type == "unigram", "--model-type '{}' is not one of bpe, unigram",
           o.model_type);
  std::string inputs;
  for (const std::string& in : o.inputs) {
    std::error_code ec;
    SW_CHECK(std::filesystem::is_regular_file(in, ec), "--in '{}': no such file", in);
    SW_CHECK(in.find(',') == std::string::npos, "--in '{}': SentencePiece's trainer cannot read a path with a comma",
             in);
    inputs += (inputs.empty() ? "" : ",") + in;
  }
  const std::unordered_map<std::string, std::string> args = {
      {"input", inputs},
      {"model_prefix", o.model_prefix},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      // Llama's set-up: every byte representable, digits one by one, the text as it is.
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"minloglevel", "1"},  // warnings and errors only
  };
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(args);
  SW_CHECK(status.ok(), "training a SentencePiece {} tokenizer of vocabulary {} on {} failed: {}", o.model_type,
           o.vocab_size, inputs, status.ToString());
  return o.model_prefix + ".model";
}

}  // namespace shardwise::train
