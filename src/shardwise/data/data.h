#pragma once
// Training data: sample i of a dataset is a fixed function of (seed, i), so the order is
// deterministic, the same on every mesh, and resumable from `consumed_samples` alone.
//   AdditionTask  the embedded default: "123+456=579\n" problems, byte tokens, padded with '\n';
//                 one problem in ten (by a hash of its operands) is held out for evaluation.
//   TokenFile     one or several token files (a comma-separated list and/or globs, concatenated
//                 in sorted order), memory-mapped read-only: raw bytes (text), headerless uint16
//                 (nanoGPT's .bin), headerless uint32, or llm.c's .bin (a 1024-byte header).
//                 Sample i is a window of seq + 1 tokens at a position drawn from (seed, i): the
//                 draw is over the corpus' valid window starts (each file's tokens - seq), taken
//                 globally in file order, so a window never crosses a file boundary and a single
//                 file samples exactly as before (position = draw % (tokens - seq)).
//                 A CorpusPart restricts it to the tokens before or after a cut (--val-fraction):
//                 the same definition over that part's window starts only.
//                 With a tokenizer (--tokenizer) the files are raw text, cut into documents and
//                 tokenized in memory (tokenize.h) once per process, then sampled the same way.
//   EvenWindows   a validation set: a fixed number of windows of a TokenFile spread evenly over its
//                 window starts, independent of the seed (--val-data, --val-fraction).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/tensor/tensor.h"
#include "shardwise/data/tokenize.h"

namespace shardwise::train {

// Test hook: SHARDWISE_TEST_UNREADABLE_FOR_RANKS=1,3 lists world ranks on which the data is
// unreadable. A DataRankScope names the world rank of the thread that creates it (the Trainer holds
// one for its rank, MPI process or thread) until it is destroyed; while a listed rank's scope is
// active on a thread, opening a data file there (TokenFile, the checkpoints' data fingerprint) is
// an Error, and the loader refuses to sample there (loader.h). Without a scope nothing is refused.
bool data_unreadable_for_rank(int world_rank);
class DataRankScope {
 public:
  explicit DataRankScope(int world_rank);
  ~DataRankScope();
  DataRankScope(const DataRankScope&) = delete;
  DataRankScope& operator=(const DataRankScope&) = delete;

 private:
  int previous_;
};
// Error naming `what` when the calling thread's DataRankScope names a listed rank.
void check_data_readable(const std::string& what);

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Writes the seq + 1 tokens of sample `index` (inputs are tokens[0..seq), labels tokens[1..seq]).
  virtual void sample(int64_t index, std::span<int64_t> tokens) const = 0;
  virtual int64_t vocab_needed() const = 0;  // the largest token + 1
  virtual std::string describe() const = 0;
};

struct Batch {
  Tensor ids, labels;  // [count, seq] i64
};
// Samples [first, first + count) of `data`.
Batch make_batch(const Dataset& data, int64_t first, int64_t count, int64_t seq);

class AdditionTask final : public Dataset {
 public:
  AdditionTask(int digits, int64_t seq, uint64_t seed);
  void sample(int64_t index, std::span<int64_t> tokens) const override;
  int64_t vocab_needed() const override { return 128; }
  std::string describe() const override;
  // Held-out problem k (never drawn for training) as tokens, and where its answer lies:
  // positions [answer_begin, answer_end) of the labels hold the answer digits and the newline.
  struct Problem {
    std::vector<int64_t> tokens;  // seq + 1
    int64_t answer_begin = 0, answer_end = 0;
  };
  Problem held_out(int64_t k) const;
  static int64_t max_length(int digits);  // longest problem in tokens, newline included

 private:
  std::pair<int64_t, int64_t> operands(uint64_t stream, int64_t index, bool held_out) const;
  Problem encode(int64_t a, int64_t b) const;
  int digits_;
  int64_t seq_;
  uint64_t seed_;
};

enum class TokenFormat { Auto, Bytes, U16, U32, Llmc };
// "auto", "bytes", "u16", "u32", "llmc"; Error otherwise.
TokenFormat parse_token_format(const std::string& name);
std::string token_format_name(TokenFormat f);
inline constexpr int32_t kLlmcMagic = 20240520;  // llm.c's header[0]; header[1] 1 = uint16, 2 = uint32

// The files `spec` names: an existing path as is, else a comma-separated list whose items may be
// globs, all sorted. Error when a glob matches nothing.
std::vector<std::string> data_files(const std::string& spec);
// `auto`: llm.c's magic at offset 0 -> llmc; a `.bin` without it -> u16; anything else -> bytes.
TokenFormat detect_token_format(const std::string& path);

// Writes `tokens` as a token file that `format` reads back: u16 or u32 headerless, or llmc (llm.c's
// 1024-byte header; version 1, uint16 tokens, when every id < `vocab` fits in 16 bits, else version
// 2, uint32). `Auto`: u16 when `vocab` <= 65536, else llmc with uint32 tokens, so that
// `--data-format auto` reads either back (a headerless u32 file needs --data-format u32). Returns the
// format written. Error for `bytes`, an id that does not fit the format, or an unwritable path.
TokenFormat write_token_file(const std::string& path, std::span<const uint32_t> tokens, TokenFormat format,
                             int64_t vocab);

// Raw text through a tokenizer (--tokenizer): the model file and how documents are cut.
struct TextTokens {
  std::string tokenizer;
  DocumentOptions documents;
};

// Which tokens of a corpus a TokenFile samples. `held_out` = F in (0, 1): the corpus' tokens in
// file order are cut at `cut = total - round(F x total)`; `Training` keeps tokens [0, cut) and
// `HeldOut` tokens [cut, total) (a file straddling the cut contributes its part on each side). A
// window of seq + 1 tokens never crosses the cut (nor a file boundary), so the two sides share no
// token. `Whole` (or F = 0): every token.
struct CorpusPart {
  enum class Side { Whole, Training, HeldOut };
  Side side = Side::Whole;
  double held_out = 0;
};

class TokenFile final : public Dataset {
 public:
  // Error when a file is unreadable, shorter than seq + 2 tokens, of another format than the
  // first, of a size that is not a whole number of tokens, or has a bad llm.c header; with a
  // part, when F is outside (0, 1) or the part holds no window of seq + 1 tokens. With `text`
  // the files are text tokenized by its tokenizer (`format` is then ignored).
  TokenFile(const std::string& spec, int64_t seq, uint64_t seed, TokenFormat format = TokenFormat::Auto,
            CorpusPart part = {}, const TextTokens* text = nullptr);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  void sample(int64_t index, std::span<int64_t> tokens) const override;
  int64_t vocab_needed() const override { return vocab_needed_; }
  std::string describe() const override;
  TokenFormat format() const { return format_; }
  int64_t seq() const { return seq_; }
  int64_t token_count() const { return total_tokens_; }  // in the part
  int64_t token(size_t file, int64_t i) const;  // token i of file `file`'s part
  // The part's valid window starts (each file's part: tokens - seq, at least 0), in file order;
  // sample(i) is the window at position (a 64-bit draw from (seed, i)) % window_starts().
  uint64_t window_starts() const { return first_position_.back(); }
  // The seq + 1 tokens of the window at `position` in [0, window_starts()).
  void window(uint64_t position, std::span<int64_t> tokens) const;

  struct Mapped {
    std::string path;
    const unsigned char* base = nullptr;  // the mapping (nullptr for an empty file)
    size_t bytes = 0;
    const unsigned char* tokens = nullptr;  // base + header (+ the part's first token)
    int64_t count = 0;                      // tokens in the part
    std::shared_ptr<const TokenizedText> text;  // a tokenized text file: base points into it (not mapped)
  };

 private:
  void map(const std::string& path);
  void adopt(const std::string& path, const TextTokens& text);
  void restrict_to(const CorpusPart& part);
  std::string spec_, part_note_, text_note_;
  std::vector<Mapped> files_;
  std::vector<uint64_t> first_position_;  // cumulative valid window starts before each file
  TokenFormat format_;
  int width_ = 1;
  int64_t seq_;
  uint64_t seed_;
  int64_t total_tokens_ = 0;
  int64_t vocab_needed_ = 0;
};

// "" -> AdditionTask(digits); otherwise a TokenFile (of `part`; of tokenized text with `text`).
std::unique_ptr<Dataset> open_dataset(const std::string& path, int digits, int64_t seq, uint64_t seed,
                                      TokenFormat format = TokenFormat::Auto, CorpusPart part = {},
                                      const TextTokens* text = nullptr);

// A fixed validation set: n = min(wanted, max(1, P / (seq + 1))) windows of `corpus` (P: its window
// starts), sample k < n the window at position floor(k x P / n). Evenly spread from the first window
// start to the last, never overlapping while n <= P / (seq + 1) ("all if fewer"), and the same for
// every seed, mesh and evaluation. Error for an index outside [0, size()).
class EvenWindows final : public Dataset {
 public:
  EvenWindows(std::unique_ptr<TokenFile> corpus, int64_t wanted);
  void sample(int64_t index, std::span<int64_t> tokens) const override;
  int64_t vocab_needed() const override { return corpus_->vocab_needed(); }
  std::string describe() const override;
  int64_t size() const { return count_; }
  const TokenFile& corpus() const { return *corpus_; }

 private:
  std::unique_ptr<TokenFile> corpus_;
  int64_t count_ = 0;
};

}  // namespace shardwise::train
