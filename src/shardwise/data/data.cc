#include "shardwise/data/data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/core/plural.h"

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

TokenFormat parse_token_format(const std::string& name) {
  if (name == "auto") return TokenFormat::Auto;
  if (name == "bytes") return TokenFormat::Bytes;
  if (name == "u16") return TokenFormat::U16;
  if (name == "u32") return TokenFormat::U32;
  if (name == "llmc") return TokenFormat::Llmc;
  fail("--data-format '{}' is not one of auto, bytes, u16, u32, llmc", name);
}

std::string token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::Auto: return "auto";
    case TokenFormat::Bytes: return "bytes";
    case TokenFormat::U16: return "u16";
    case TokenFormat::U32: return "u32";
    case TokenFormat::Llmc: return "llmc";
  }
  return "?";
}

namespace {

constexpr size_t kLlmcHeaderBytes = 256 * 4;

int32_t read_i32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The largest token + 1 of a mapped file, scanned once per process (in-process ranks share it):
// keyed by path, size, modification time and token width.
int64_t scan_vocab(const TokenFile::Mapped& m, int width) {
  static std::mutex mutex;
  static std::map<std::string, int64_t> cache;
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(m.path, ec).time_since_epoch().count();
  const std::string key = fmt::format("{}\n{}\n{}\n{}", m.path, m.bytes, mtime, width);
  {
    std::lock_guard lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  int64_t v = 0;
  const auto n = static_cast<size_t>(m.count);
  const unsigned char* t = m.tokens;
  if (width == 1) {
    for (size_t i = 0; i < n; ++i) v = std::max<int64_t>(v, t[i]);
  } else if (width == 2) {
    for (size_t i = 0; i < n; ++i) v = std::max<int64_t>(v, t[2 * i] | t[2 * i + 1] << 8);
  } else {
    for (size_t i = 0; i < n; ++i) v = std::max<int64_t>(v, static_cast<uint32_t>(read_i32(t + 4 * i)));
  }
  std::lock_guard lock(mutex);
  cache[key] = v + 1;
  return v + 1;
}

}  // namespace

std::vector<std::string> data_files(const std::string& spec) {
  if (std::filesystem::exists(spec)) return {spec};
  std::vector<std::string> out;
  std::stringstream items(spec);
  for (std::string item; std::getline(items, item, ',');) {
    item = trim(item);
    if (item.empty()) continue;
    if (item.find_first_of("*?[") == std::string::npos) {
      out.push_back(item);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(item.c_str(), 0, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    SW_CHECK(rc == 0, "--data '{}': the pattern '{}' matches no file", spec, item);
  }
  SW_CHECK(!out.empty(), "--data '{}' names no file", spec);
  std::sort(out.begin(), out.end());
  return out;
}

TokenFormat detect_token_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SW_CHECK(in.good(), "cannot read the data file '{}'", path);
  unsigned char head[4] = {};
  in.read(reinterpret_cast<char*>(head), 4);
  if (in.gcount() == 4 && read_i32(head) == kLlmcMagic) return TokenFormat::Llmc;
  return path.ends_with(".bin") ? TokenFormat::U16 : TokenFormat::Bytes;
}

TokenFormat write_token_file(const std::string& path, std::span<const uint32_t> tokens, TokenFormat format,
                             int64_t vocab) {
  SW_CHECK(format != TokenFormat::Bytes, "--format bytes cannot hold a tokenizer's ids: use u16, u32 or llmc");
  if (format == TokenFormat::Auto) format = vocab <= 65536 ? TokenFormat::U16 : TokenFormat::Llmc;
  uint32_t largest = 0;
  for (uint32_t t : tokens) largest = std::max(largest, t);
  const bool narrow = vocab <= 65536 && largest <= 0xFFFF;
  SW_CHECK(format != TokenFormat::U16 || narrow,
           "--format u16 holds ids below 65536; the vocabulary has {} ids (largest id written {}): use u32 or llmc",
           vocab, largest);
  SW_CHECK(format != TokenFormat::Llmc || tokens.size() <= static_cast<size_t>(INT32_MAX),
           "llm.c's header counts at most {} tokens; the text has {}: write several files", INT32_MAX, tokens.size());
  const int width = format == TokenFormat::U32 || (format == TokenFormat::Llmc && !narrow) ? 4 : 2;
  std::vector<unsigned char> bytes;
  auto put = [&](uint32_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i) & 0xFF));
  };
  if (format == TokenFormat::Llmc) {
    put(static_cast<uint32_t>(kLlmcMagic), 4), put(width == 2 ? 1 : 2, 4), put(static_cast<uint32_t>(tokens.size()), 4);
    for (int i = 3; i < 256; ++i) put(0, 4);
  }
  bytes.reserve(bytes.size() + tokens.size() * static_cast<size_t>(width));
  for (uint32_t t : tokens) put(t, width);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  SW_CHECK(out.good(), "cannot write the token file '{}' ({} bytes)", path, bytes.size());
  return format;
}

void TokenFile::map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  SW_CHECK(fd >= 0, "cannot read the data file '{}'", path);
  struct stat st {};
  const bool statted = ::fstat(fd, &st) == 0;
  Mapped m{path, nullptr, statted ? static_cast<size_t>(st.st_size) : 0, nullptr, 0, nullptr};
  void* p = statted && m.bytes > 0 ? ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  SW_CHECK(statted && p != MAP_FAILED, "cannot map the data file '{}' ({} bytes)", path, m.bytes);
  m.base = static_cast<const unsigned char*>(p);
  files_.push_back(m);  // unmapped by the destructor from here on, whatever the checks below say
}

// A tokenized text file as a u32 "file" whose bytes are the tokens held in memory (shared by the
// process's ranks through tokenize_file_cached).
void TokenFile::adopt(const std::string& path, const TextTokens& text) {
  std::shared_ptr<const TokenizedText> t = tokenize_file_cached(text.tokenizer, path, text.documents);
  const size_t bytes = t->tokens.size() * sizeof(uint32_t);
  files_.push_back({path, bytes ? reinterpret_cast<const unsigned char*>(t->tokens.data()) : nullptr, bytes, nullptr,
                    0, t});
}

namespace {
thread_local int data_rank = -1;  // the calling thread's DataRankScope (-1: none)
}  // namespace

bool data_unreadable_for_rank(int world_rank) {
  const char* list = std::getenv("SHARDWISE_TEST_UNREADABLE_FOR_RANKS");
  if (list == nullptr || world_rank < 0) return false;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty() && std::stoi(item) == world_rank) return true;
  }
  return false;
}

DataRankScope::DataRankScope(int world_rank) : previous_(data_rank) { data_rank = world_rank; }
DataRankScope::~DataRankScope() { data_rank = previous_; }

void check_data_readable(const std::string& what) {
  SW_CHECK(!data_unreadable_for_rank(data_rank),
           "rank {} opened the data '{}', which is unreadable there (test hook SHARDWISE_TEST_UNREADABLE_FOR_RANKS={}): "
           "only the ranks that read batches may open it",
           data_rank, what, std::getenv("SHARDWISE_TEST_UNREADABLE_FOR_RANKS"));
}

TokenFile::TokenFile(const std::string& spec, int64_t seq, uint64_t seed, TokenFormat format, CorpusPart part,
                     const TextTokens* text)
    : spec_(spec), format_(format), seq_(seq), seed_(seed) {
  check_data_readable(spec);
  const std::vector<std::string> paths = data_files(spec);
  for (const std::string& path : paths) {
    SW_CHECK(!std::filesystem::is_directory(path),
             "--data '{}' is a directory; expected a text file (byte tokens) or a .bin file of uint16 tokens", path);
    const TokenFormat f = text ? TokenFormat::U32 : format == TokenFormat::Auto ? detect_token_format(path) : format;
    SW_CHECK(path == paths.front() || f == format_, "'{}' holds {} tokens, '{}' {}: the files of one corpus share a format",
             paths.front(), token_format_name(format_), path, token_format_name(f));
    format_ = f;
    if (text) adopt(path, *text);
    else map(path);
    Mapped& m = files_.back();
    size_t header = 0;
    int width = f == TokenFormat::Bytes ? 1 : f == TokenFormat::U16 ? 2 : 4;
    if (f == TokenFormat::Llmc) {
      header = kLlmcHeaderBytes;
      SW_CHECK(m.bytes >= header, "'{}' holds {} bytes, shorter than llm.c's header of {}", path, m.bytes, header);
      const int32_t magic = read_i32(m.base), version = read_i32(m.base + 4), count = read_i32(m.base + 8);
      SW_CHECK(magic == kLlmcMagic, "'{}' is not an llm.c token file: header[0] is {}, not the magic {}", path, magic,
               kLlmcMagic);
      SW_CHECK(version == 1 || version == 2,
               "'{}': llm.c header version {} (expected 1 for uint16 tokens or 2 for uint32)", path, version);
      width = version == 1 ? 2 : 4;
      SW_CHECK(count >= 0 && static_cast<size_t>(count) * static_cast<size_t>(width) == m.bytes - header,
               "'{}': the llm.c header says {} tokens ({} bytes), the file holds {} bytes after its {}-byte header", path,
               count, static_cast<int64_t>(count) * width, m.bytes - header, header);
    }
    SW_CHECK((m.bytes - header) % static_cast<size_t>(width) == 0,
             "'{}' holds {} bytes: not a whole number of {}-byte ({}) tokens", path, m.bytes - header, width,
             token_format_name(f));
    SW_CHECK(path == paths.front() || width == width_, "'{}' holds {}-byte tokens, '{}' {}-byte: one corpus, one width",
             paths.front(), width_, path, width);
    width_ = width;
    m.tokens = m.base ? m.base + header : nullptr;
    m.count = static_cast<int64_t>((m.bytes - header) / static_cast<size_t>(width));
    SW_CHECK(m.count >= seq + 1, "'{}' holds {} tokens; sequences of {} need at least {}", path, m.count, seq, seq + 1);
  }
  for (const Mapped& m : files_)  // whole files
    vocab_needed_ = std::max(vocab_needed_, m.text ? m.text->max_id + 1 : scan_vocab(m, width_));
  if (text) {
    int64_t documents = 0;
    for (const Mapped& m : files_) documents += m.text->documents;
    text_note_ = fmt::format("text tokenized by {}: {}, {}", text->tokenizer, counted(documents, "document"),
                             text->documents.describe());
  }
  restrict_to(part);
  first_position_.push_back(0);
  for (const Mapped& m : files_) {
    total_tokens_ += m.count;
    first_position_.push_back(first_position_.back() + static_cast<uint64_t>(std::max<int64_t>(0, m.count - seq)));
  }
  if (part.side != CorpusPart::Side::Whole) {
    SW_CHECK(first_position_.back() > 0,
             "--val-fraction {} leaves the {} part of '{}' {} tokens ({}): no file's part holds a window of {} tokens "
             "(--seq {} + 1); use a {} --val-fraction or more data",
             part.held_out, part.side == CorpusPart::Side::Training ? "training" : "validation", spec, total_tokens_,
             part_note_.substr(part_note_.find(':') + 2), seq + 1, seq,
             part.side == CorpusPart::Side::Training ? "smaller" : "larger");
  }
}

// Cuts each file's tokens to the part: global token g (file order) is on the training side iff
// g < cut, with cut = total - round(F x total).
void TokenFile::restrict_to(const CorpusPart& part) {
  if (part.side == CorpusPart::Side::Whole) return;
  SW_CHECK(part.held_out > 0 && part.held_out < 1, "--val-fraction must be in (0, 1), got {}", part.held_out);
  int64_t total = 0;
  for (const Mapped& m : files_) total += m.count;
  const int64_t cut = total - std::llround(part.held_out * static_cast<double>(total));
  const bool training = part.side == CorpusPart::Side::Training;
  part_note_ = training ? fmt::format("training part: tokens [0, {}) of {}", cut, total)
                        : fmt::format("validation part: tokens [{}, {}) of {}", cut, total, total);
  int64_t first = 0;  // the file's first global token
  for (Mapped& m : files_) {
    const int64_t before_cut = std::clamp<int64_t>(cut - first, 0, m.count);  // the file's tokens on the training side
    first += m.count;
    if (training) {
      m.count = before_cut;
    } else {
      m.tokens = m.tokens ? m.tokens + static_cast<size_t>(before_cut) * static_cast<size_t>(width_) : nullptr;
      m.count -= before_cut;
    }
  }
}

TokenFile::~TokenFile() {
  for (const Mapped& m : files_) {
    if (m.base && !m.text) ::munmap(const_cast<unsigned char*>(m.base), m.bytes);
  }
}

int64_t TokenFile::token(size_t file, int64_t i) const {
  const unsigned char* t = files_[file].tokens;
  const auto k = static_cast<size_t>(i);
  if (width_ == 1) return t[k];
  if (width_ == 2) return t[2 * k] | t[2 * k + 1] << 8;
  return static_cast<uint32_t>(read_i32(t + 4 * k));
}

void TokenFile::sample(int64_t index, std::span<int64_t> tokens) const {
  Philox rng(seed_, stream_id("token-file"));
  uint64_t r = static_cast<uint64_t>(rng.bits(2 * static_cast<uint64_t>(index))) << 32 | rng.bits(2 * static_cast<uint64_t>(index) + 1);
  window(r % window_starts(), tokens);
}

void TokenFile::window(uint64_t position, std::span<int64_t> tokens) const {
  SW_CHECK(static_cast<int64_t>(tokens.size()) == seq_ + 1, "a sample of sequence length {} has {} tokens, got room for {}",
           seq_, seq_ + 1, tokens.size());
  SW_CHECK(position < window_starts(), "window {} of {}: it has {} window starts", position, spec_, window_starts());
  // The file whose valid window starts hold `position` (a file without any is skipped: upper_bound
  // passes its equal bounds); a single file: start = position.
  const auto file = static_cast<size_t>(std::upper_bound(first_position_.begin(), first_position_.end(), position) -
                                        first_position_.begin() - 1);
  const auto start = static_cast<int64_t>(position - first_position_[file]);
  for (int64_t i = 0; i <= seq_; ++i) tokens[static_cast<size_t>(i)] = token(file, start + i);
}

std::string TokenFile::describe() const {
  const std::string files = files_.size() > 1 ? fmt::format(" in {} files", files_.size()) : "";
  const std::string width = format_ == TokenFormat::Llmc ? fmt::format(" (uint{})", width_ * 8) : "";
  const std::string tokens = part_note_.empty() ? fmt::format("{} tokens", total_tokens_) : part_note_;
  const std::string what = text_note_.empty() ? token_format_name(format_) + width + " format" : text_note_;
  return fmt::format("{} ({}, {}{}, vocabulary needed {})", spec_, what, tokens, files, vocab_needed_);
}

EvenWindows::EvenWindows(std::unique_ptr<TokenFile> corpus, int64_t wanted) : corpus_(std::move(corpus)) {
  SW_CHECK(wanted >= 1, "--val-samples must be at least 1, got {}", wanted);
  const uint64_t disjoint = corpus_->window_starts() / static_cast<uint64_t>(corpus_->seq() + 1);
  count_ = std::min<int64_t>(wanted, std::max<int64_t>(1, static_cast<int64_t>(disjoint)));
}

void EvenWindows::sample(int64_t index, std::span<int64_t> tokens) const {
  SW_CHECK(index >= 0 && index < count_, "validation sequence {} of {}: there are {}", index, corpus_->describe(), count_);
  const auto p = static_cast<unsigned __int128>(corpus_->window_starts()) * static_cast<uint64_t>(index) /
                 static_cast<uint64_t>(count_);
  corpus_->window(static_cast<uint64_t>(p), tokens);
}

std::string EvenWindows::describe() const {
  return fmt::format("{} sequences of {} tokens spread evenly over {}", count_, corpus_->seq() + 1, corpus_->describe());
}

std::unique_ptr<Dataset> open_dataset(const std::string& path, int digits, int64_t seq, uint64_t seed,
                                      TokenFormat format, CorpusPart part, const TextTokens* text) {
  if (path.empty()) return std::make_unique<AdditionTask>(digits, seq, seed);
  return std::make_unique<TokenFile>(path, seq, seed, format, part, text);
}

}  // namespace shardwise::train
