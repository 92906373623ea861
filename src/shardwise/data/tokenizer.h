#pragma once
// Text in and out: a SentencePiece model (`tokenizer.model`, as Llama ships it), read with Debian's
// libsentencepiece. The library is an implementation detail of tokenizer.cc; callers see ids as
// int64_t and text as UTF-8 strings.
//
//   Tokenizer t("tokenizer.model");           // Error: missing file, not a SentencePiece model
//   std::vector<int64_t> ids = t.encode(text);  // no bos/eos added: callers place them
//   std::string back = t.decode(ids);           // control ids (bos, eos, pad) decode to nothing
//
// encode() adds no special ids; decode() refuses ids outside [0, vocab_size()). A model trained
// with byte fallback and the identity normalization (as train_tokenizer does, and as Llama's is)
// gives decode(encode(text)) == text for any UTF-8 text.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace shardwise::train {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(std::span<const int64_t> ids) const;
  int64_t vocab_size() const { return vocab_; }
  // -1 when the model defines none.
  int64_t bos_id() const { return bos_; }
  int64_t eos_id() const { return eos_; }
  int64_t pad_id() const { return pad_; }
  int64_t unk_id() const { return unk_; }
  std::string piece(int64_t id) const;  // the piece's text ("▁the", "<0x0A>", "</s>"); Error outside the vocabulary
  const std::string& path() const { return path_; }
  // "tokenizer.model (SentencePiece, vocabulary 512, bos 1, eos 2)"
  std::string describe() const;

 private:
  void check_id(int64_t id) const;
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int64_t vocab_ = 0, bos_ = -1, eos_ = -1, pad_ = -1, unk_ = -1;
};

// SentencePiece's trainer on text files (`shardwise tokenize --train-model`): writes
// `<prefix>.model` and `<prefix>.vocab`. Set up as Llama's tokenizer is (ids unk 0, bos 1, eos 2,
// no pad; byte fallback; digits split; no normalization, whitespace kept), so decode(encode(text))
// gives the text back. Deterministic (one thread); each line of the inputs is a training sentence.
// Error naming the inputs, the vocabulary size and SentencePiece's message when it fails (e.g. a
// vocabulary larger than the text can fill, or smaller than the 259 byte and control pieces).
struct TokenizerTraining {
  std::vector<std::string> inputs;
  std::string model_prefix;
  int64_t vocab_size = 512;
  std::string model_type = "bpe";  // bpe or unigram
};
// Returns the path of the model written.
std::string train_tokenizer(const TokenizerTraining& options);

}  // namespace shardwise::train
