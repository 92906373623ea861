// Token files in the formats people have (nanoGPT's uint16 .bin, llm.c's .bin with its header,
// headerless uint32, bytes), memory-mapped, and several files as one corpus.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/data/data.h"
#include "tests/support/error_of.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-token-files-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void put_le(std::ofstream& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.put(static_cast<char>(v >> (8 * i) & 0xFF));
}

// Headerless little-endian tokens of `width` bytes.
void write_tokens(const fs::path& p, const std::vector<uint32_t>& tokens, int width) {
  std::ofstream out(p, std::ios::binary);
  for (uint32_t t : tokens) put_le(out, t, width);
}

// llm.c's format: 256 int32 (magic, version, count, zeros), then the tokens.
void write_llmc(const fs::path& p, const std::vector<uint32_t>& tokens, int32_t version = 1, int64_t count = -1) {
  std::ofstream out(p, std::ios::binary);
  put_le(out, static_cast<uint32_t>(kLlmcMagic), 4);
  put_le(out, static_cast<uint32_t>(version), 4);
  put_le(out, static_cast<uint32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count), 4);
  for (int i = 3; i < 256; ++i) put_le(out, 0, 4);
  for (uint32_t t : tokens) put_le(out, t, version == 2 ? 4 : 2);
}

std::vector<uint32_t> ramp(size_t n, uint32_t first, uint32_t step) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<uint32_t>(i) * step;
  return v;
}

// The sampling formula from before memory mapping, on the whole file read into a vector.
std::vector<int64_t> legacy_sample(const std::vector<uint16_t>& all, int64_t seq, uint64_t seed, int64_t index) {
  Philox rng(seed, stream_id("token-file"));
  uint64_t positions = all.size() - static_cast<uint64_t>(seq);
  uint64_t r = static_cast<uint64_t>(rng.bits(2 * static_cast<uint64_t>(index))) << 32 |
               rng.bits(2 * static_cast<uint64_t>(index) + 1);
  uint64_t start = r % positions;
  return {all.begin() + static_cast<int64_t>(start), all.begin() + static_cast<int64_t>(start) + seq + 1};
}

TEST(TokenFiles, SingleTextAndUint16FilesSampleAsBefore) {
  fs::path d = temp_dir("legacy");
  std::string text;
  for (int i = 0; i < 3000; ++i) text += static_cast<char>(32 + (i * 37) % 95);
  { std::ofstream(d / "a.txt") << text; }
  std::vector<uint32_t> u16 = ramp(2000, 3, 31);
  for (auto& t : u16) t &= 0xFFFF;
  write_tokens(d / "a.bin", u16, 2);
  std::vector<uint16_t> text_tokens(text.begin(), text.end()), bin_tokens(u16.begin(), u16.end());
  for (auto& t : text_tokens) t &= 0xFF;
  TokenFile bytes((d / "a.txt").string(), 16, 7), tokens((d / "a.bin").string(), 16, 7);
  EXPECT_EQ(bytes.format(), TokenFormat::Bytes);
  EXPECT_EQ(tokens.format(), TokenFormat::U16);
  std::vector<int64_t> w(17);
  for (int64_t i = 0; i < 200; ++i) {
    bytes.sample(i, w);
    EXPECT_EQ(w, legacy_sample(text_tokens, 16, 7, i)) << i;
    tokens.sample(i, w);
    EXPECT_EQ(w, legacy_sample(bin_tokens, 16, 7, i)) << i;
  }
}

TEST(TokenFiles, LlmcFileIsReadBackExactly) {
  fs::path d = temp_dir("llmc");
  std::vector<uint32_t> t = ramp(500, 100, 97);
  for (auto& x : t) x %= 50257;
  write_llmc(d / "train.bin", t);
  TokenFile f((d / "train.bin").string(), 8, 1);
  EXPECT_EQ(f.format(), TokenFormat::Llmc);
  ASSERT_EQ(f.token_count(), 500);
  for (int64_t i = 0; i < 500; ++i) EXPECT_EQ(f.token(0, i), t[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(f.vocab_needed(), *std::max_element(t.begin(), t.end()) + 1);
  EXPECT_NE(f.describe().find("llmc"), std::string::npos) << f.describe();
  EXPECT_NE(f.describe().find("500 tokens"), std::string::npos) << f.describe();
  // Version 2: uint32 tokens.
  write_llmc(d / "wide.bin", ramp(300, 70000, 3), 2);
  TokenFile w((d / "wide.bin").string(), 8, 1);
  EXPECT_EQ(w.token(0, 299), 70000 + 299 * 3);
  EXPECT_EQ(w.vocab_needed(), 70000 + 299 * 3 + 1);
}

TEST(TokenFiles, AutoDetectsByContent) {
  fs::path d = temp_dir("auto");
  write_llmc(d / "with-magic.bin", ramp(100, 0, 1));
  write_tokens(d / "without-magic.bin", ramp(100, 0, 1), 2);
  write_tokens(d / "tokens.u16", ramp(100, 0, 1), 2);
  EXPECT_EQ(detect_token_format((d / "with-magic.bin").string()), TokenFormat::Llmc);
  EXPECT_EQ(detect_token_format((d / "without-magic.bin").string()), TokenFormat::U16);
  EXPECT_EQ(detect_token_format((d / "tokens.u16").string()), TokenFormat::Bytes);
  // --data-format u16 on a .u16 file: tokens, not bytes.
  TokenFile u16((d / "tokens.u16").string(), 8, 1, TokenFormat::U16);
  EXPECT_EQ(u16.format(), TokenFormat::U16);
  EXPECT_EQ(u16.token_count(), 100);
  EXPECT_EQ(u16.vocab_needed(), 100);
  EXPECT_EQ(TokenFile((d / "tokens.u16").string(), 8, 1).token_count(), 200);  // auto: bytes
  EXPECT_EQ(parse_token_format("u32"), TokenFormat::U32);
  EXPECT_NE(error_of([] { parse_token_format("u8"); }).find("'u8' is not one of"), std::string::npos);
}

TEST(TokenFiles, Uint32TokensAboveUint16) {
  fs::path d = temp_dir("u32");
  std::vector<uint32_t> t = ramp(400, 65000, 301);
  write_tokens(d / "big.u32", t, 4);
  TokenFile f((d / "big.u32").string(), 12, 5, TokenFormat::U32);
  EXPECT_EQ(f.token_count(), 400);
  EXPECT_EQ(f.vocab_needed(), 65000 + 399 * 301 + 1);
  std::vector<int64_t> w(13);
  for (int64_t i = 0; i < 20; ++i) {
    f.sample(i, w);
    for (size_t k = 1; k < w.size(); ++k) EXPECT_EQ(w[k] - w[k - 1], 301);
  }
}

TEST(TokenFiles, BadHeadersAndSizesAreNamed) {
  fs::path d = temp_dir("bad");
  const std::string v3 = (d / "v3.bin").string(), count = (d / "count.bin").string();
  write_llmc(v3, ramp(100, 0, 1), 3);
  EXPECT_NE(error_of([&] { TokenFile(v3, 8, 1); }).find("'" + v3 + "': llm.c header version 3"), std::string::npos)
      << error_of([&] { TokenFile(v3, 8, 1); });
  write_llmc(count, ramp(100, 0, 1), 1, 120);
  EXPECT_NE(error_of([&] { TokenFile(count, 8, 1); })
                .find("'" + count + "': the llm.c header says 120 tokens (240 bytes), the file holds 200 bytes"),
            std::string::npos)
      << error_of([&] { TokenFile(count, 8, 1); });
  const std::string odd = (d / "odd.bin").string(), u32 = (d / "six.u32").string();
  { std::ofstream(odd, std::ios::binary) << std::string(101, 'x'); }
  EXPECT_NE(error_of([&] { TokenFile(odd, 8, 1); }).find("'" + odd + "' holds 101 bytes: not a whole number of 2-byte"),
            std::string::npos);
  { std::ofstream(u32, std::ios::binary) << std::string(102, 'x'); }
  EXPECT_NE(error_of([&] { TokenFile(u32, 8, 1, TokenFormat::U32); }).find("holds 102 bytes: not a whole number of 4-byte"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TokenFile(odd, 8, 1, TokenFormat::Llmc); }).find("shorter than llm.c's header of 1024"),
            std::string::npos);
}

TEST(TokenFiles, GlobOfShardsIsOneCorpus) {
  fs::path d = temp_dir("glob");
  for (uint32_t k = 0; k < 3; ++k) write_llmc(d / ("shard_" + std::to_string(k) + ".bin"), ramp(100 + 50 * k, 1000 * k, 1));
  write_tokens(d / "other.txt", ramp(10, 0, 1), 1);  // not matched
  const std::string pattern = (d / "shard_*.bin").string();
  TokenFile corpus(pattern, 16, 9), again(pattern, 16, 9);
  EXPECT_EQ(corpus.token_count(), 100 + 150 + 200);
  EXPECT_NE(corpus.describe().find("in 3 files"), std::string::npos) << corpus.describe();
  std::vector<int64_t> w(17), v(17);
  std::vector<int> drawn(3, 0);
  for (int64_t i = 0; i < 300; ++i) {
    corpus.sample(i, w);
    again.sample(i, v);
    EXPECT_EQ(w, v);
    const int64_t shard = w[0] / 1000;
    ++drawn[static_cast<size_t>(shard)];
    for (size_t k = 1; k < w.size(); ++k) EXPECT_EQ(w[k], w[k - 1] + 1) << "sample " << i << " crosses a file boundary";
  }
  for (int n : drawn) EXPECT_GT(n, 0);
  // A comma-separated list, in any order, is the same corpus.
  TokenFile listed((d / "shard_2.bin").string() + "," + (d / "shard_0.bin").string() + "," + (d / "shard_1.bin").string(),
                   16, 9);
  for (int64_t i = 0; i < 50; ++i) {
    corpus.sample(i, w);
    listed.sample(i, v);
    EXPECT_EQ(w, v);
  }
  EXPECT_NE(error_of([&] { TokenFile((d / "none_*.bin").string(), 16, 9); }).find("matches no file"), std::string::npos);
  write_tokens(d / "shard_3.bin", ramp(100, 0, 1), 2);  // no magic: u16
  EXPECT_NE(error_of([&] { TokenFile(pattern, 16, 9); }).find("share a format"), std::string::npos);
}

}  // namespace
}  // namespace shardwise::train
