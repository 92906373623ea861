#include "shardwise/train/data.h"

#include <filesystem>

#include <fstream>
#include <iterator>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"

namespace shardwise::train {

Batch make_batch(const Dataset& data, int64_t first, int64_t count, int64_t seq) {
  Batch b{Tensor(DType::I64, Shape{count, seq}), Tensor(DType::I64, Shape{count, seq})};
  std::vector<int64_t> tokens(static_cast<size_t>(seq + 1));
  for (int64_t i = 0; i < count; ++i) {
    data.sample(first + i, tokens);
    std::copy(tokens.begin(), tokens.end() - 1, b.ids.data<int64_t>() + i * seq);
    std::copy(tokens.begin() + 1, tokens.end(), b.labels.data<int64_t>() + i * seq);
  }
  return b;
}

namespace {

int64_t power10(int digits) {
  int64_t p = 1;
  for (int i = 0; i < digits; ++i) p *= 10;
  return p;
}

// One problem in ten is held out, by a hash of its operands.
bool is_held_out(int64_t a, int64_t b) {
  uint64_t h = static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(b) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  return h % 10 == 0;
}

}  // namespace

AdditionTask::AdditionTask(int digits, int64_t seq, uint64_t seed) : digits_(digits), seq_(seq), seed_(seed) {
  SW_CHECK(digits >= 1 && digits <= 9, "the addition task takes 1 to 9 digits, got {}", digits);
  SW_CHECK(seq + 1 >= max_length(digits),
           "sequence length {} is too short for {}-digit addition: a problem takes up to {} tokens (use --seq {})",
           seq, digits, max_length(digits), max_length(digits) - 1);
}

int64_t AdditionTask::max_length(int digits) { return 2 * digits + 2 + (digits + 1) + 1; }

std::string AdditionTask::describe() const {
  const auto d = static_cast<size_t>(digits_);
  const int64_t a = std::stoll(std::string("123456789").substr(0, d)), b = std::stoll(std::string("456789123").substr(0, d));
  return fmt::format("embedded {}-digit addition (like \"{}+{}={}\"), byte tokens, 1 problem in 10 held out", digits_, a,
                     b, a + b);
}

std::pair<int64_t, int64_t> AdditionTask::operands(uint64_t stream, int64_t index, bool held_out) const {
  Philox rng(seed_, stream);
  const auto n = static_cast<uint64_t>(power10(digits_));
  // Rejection sampling with a per-sample counter: deterministic and independent of other samples.
  for (uint64_t attempt = 0;; ++attempt) {
    uint64_t base = (static_cast<uint64_t>(index) << 8 | attempt) * 2;
    auto a = static_cast<int64_t>(rng.bits(base) % n), b = static_cast<int64_t>(rng.bits(base + 1) % n);
    if (is_held_out(a, b) == held_out) return {a, b};
  }
}

AdditionTask::Problem AdditionTask::encode(int64_t a, int64_t b) const {
  std::string prompt = fmt::format("{}+{}=", a, b), answer = fmt::format("{}\n", a + b);
  Problem p;
  p.tokens.assign(static_cast<size_t>(seq_ + 1), '\n');
  std::string text = prompt + answer;
  for (size_t i = 0; i < text.size(); ++i) p.tokens[i] = static_cast<unsigned char>(text[i]);
  // labels[t] = tokens[t + 1]: the answer's first token is predicted at the position of '='.
  p.answer_begin = static_cast<int64_t>(prompt.size()) - 1;
  p.answer_end = p.answer_begin + static_cast<int64_t>(answer.size());
  return p;
}

void AdditionTask::sample(int64_t index, std::span<int64_t> tokens) const {
  SW_CHECK(static_cast<int64_t>(tokens.size()) == seq_ + 1, "a sample of sequence length {} has {} tokens, got room for {}",
           seq_, seq_ + 1, tokens.size());
  auto [a, b] = operands(stream_id("addition/train"), index, false);
  Problem p = encode(a, b);
  std::copy(p.tokens.begin(), p.tokens.end(), tokens.begin());
}

AdditionTask::Problem AdditionTask::held_out(int64_t k) const {
  auto [a, b] = operands(stream_id("addition/eval"), k, true);
  return encode(a, b);
}

TokenFile::TokenFile(const std::string& path, int64_t seq, uint64_t seed) : path_(path), seq_(seq), seed_(seed) {
  SW_CHECK(!std::filesystem::is_directory(path),
           "--data '{}' is a directory; expected a text file (byte tokens) or a .bin file of uint16 tokens", path);
  std::ifstream in(path, std::ios::binary);
  SW_CHECK(in.good(), "cannot read the data file '{}'", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (path.ends_with(".bin")) {
    SW_CHECK(bytes.size() % 2 == 0, "'{}' holds {} bytes: a .bin file of uint16 tokens has an even size", path,
             bytes.size());
    tokens_.resize(bytes.size() / 2);
    for (size_t i = 0; i < tokens_.size(); ++i) {
      tokens_[i] = static_cast<uint16_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                         static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
    }
  } else {
    tokens_.assign(bytes.begin(), bytes.end());
    for (auto& t : tokens_) t = static_cast<uint16_t>(t & 0xFF);
  }
  SW_CHECK(static_cast<int64_t>(tokens_.size()) >= seq + 2, "'{}' holds {} tokens; sequences of {} need at least {}",
           path, tokens_.size(), seq, seq + 2);
  for (uint16_t t : tokens_) vocab_needed_ = std::max<int64_t>(vocab_needed_, t + 1);
}

void TokenFile::sample(int64_t index, std::span<int64_t> tokens) const {
  SW_CHECK(static_cast<int64_t>(tokens.size()) == seq_ + 1, "a sample of sequence length {} has {} tokens, got room for {}",
           seq_, seq_ + 1, tokens.size());
  Philox rng(seed_, stream_id("token-file"));
  uint64_t positions = tokens_.size() - static_cast<uint64_t>(seq_);
  uint64_t r = static_cast<uint64_t>(rng.bits(2 * static_cast<uint64_t>(index))) << 32 | rng.bits(2 * static_cast<uint64_t>(index) + 1);
  uint64_t start = r % positions;
  for (int64_t i = 0; i <= seq_; ++i) tokens[static_cast<size_t>(i)] = tokens_[start + static_cast<uint64_t>(i)];
}

std::string TokenFile::describe() const {
  return fmt::format("{} ({} tokens{}, vocabulary needed {})", path_, tokens_.size(),
                     path_.ends_with(".bin") ? ", uint16" : ", bytes", vocab_needed_);
}

std::unique_ptr<Dataset> open_dataset(const std::string& path, int digits, int64_t seq, uint64_t seed) {
  if (path.empty()) return std::make_unique<AdditionTask>(digits, seq, seed);
  return std::make_unique<TokenFile>(path, seq, seed);
}

}  // namespace shardwise::train
