#pragma once
// Training data: sample i of a dataset is a fixed function of (seed, i), so the order is
// deterministic, the same on every mesh, and resumable from `consumed_samples` alone.
//   AdditionTask  the embedded default: "123+456=579\n" problems, byte tokens, padded with '\n';
//                 one problem in ten (by a hash of its operands) is held out for evaluation.
//   TokenFile     a text file (byte-level tokens) or pre-tokenized uint16 `.bin` file; sample i is
//                 a window of seq + 1 tokens at a position drawn from (seed, i).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardwise/tensor/tensor.h"

namespace shardwise::train {

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

class TokenFile final : public Dataset {
 public:
  // `.bin`: little-endian uint16 tokens; anything else: the file's bytes. Error when unreadable or
  // shorter than seq + 2 tokens.
  TokenFile(const std::string& path, int64_t seq, uint64_t seed);
  void sample(int64_t index, std::span<int64_t> tokens) const override;
  int64_t vocab_needed() const override { return vocab_needed_; }
  std::string describe() const override;

 private:
  std::string path_;
  std::vector<uint16_t> tokens_;
  int64_t seq_;
  uint64_t seed_;
  int64_t vocab_needed_ = 0;
};

// "" -> AdditionTask(digits); otherwise a TokenFile.
std::unique_ptr<Dataset> open_dataset(const std::string& path, int digits, int64_t seq, uint64_t seed);

}  // namespace shardwise::train
