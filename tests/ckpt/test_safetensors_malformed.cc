// Thousands of deterministic malformed variants of valid files (truncated, flipped bytes, huge
// and off-by-some header lengths, rewritten headers: overlapping offsets, gaps, bad dtypes, bad
// JSON, non-UTF-8, huge numbers, deep nesting). The reader must answer each with a clean Error or
// a header whose every tensor lies inside the file; never a crash or another exception type.
// (`make test-asan` runs this under AddressSanitizer; `make fuzz` runs the libFuzzer target.)
#include <gtest/gtest.h>

#include <cstring>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

const fs::path kFixture = fs::path(SHARDWISE_CKPT_FIXTURES) / "hf_mlp_f32_with_metadata.safetensors";

struct Rng {  // splitmix64
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

struct Outcome {
  int accepted = 0, rejected = 0;
};

// Parses; fails the test on anything but success or shardwise::Error.
bool check(const std::vector<std::byte>& file, Outcome& o, const std::string& what) {
  try {
    StHeader h = parse_safetensors(file, "variant.safetensors");
    for (const auto& t : h.tensors) {
      EXPECT_LE(h.data_start() + t.end, file.size()) << what;
      EXPECT_LE(t.begin, t.end) << what;
    }
    ++o.accepted;
    return true;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("variant.safetensors"), std::string::npos) << e.what();
    ++o.rejected;
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a shardwise::Error: " << e.what();
  } catch (...) {
    ADD_FAILURE() << what << ": unknown exception";
  }
  return false;
}

std::vector<std::byte> with_header(const std::string& header, size_t data) {
  std::vector<std::byte> b(8 + header.size() + data, std::byte{0});
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

std::vector<std::vector<std::byte>> valid_files() {
  MappedFile fixture(kFixture);
  std::vector<std::vector<std::byte>> out = {{fixture.bytes().begin(), fixture.bytes().end()}};
  Tensor a = Tensor::from<float>(Shape{2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::scalar<int64_t>(7);
  Tensor c(DType::BF16, Shape{0, 3});
  Tensor d = Tensor::from<uint8_t>(Shape{3}, std::vector<uint8_t>{1, 2, 3});
  std::vector<StEntry> e = {entry_of("a", a), entry_of("b", b), entry_of("c", c), entry_of("d", d)};
  out.push_back(serialize_safetensors(e, StMetadata{{"format", "pt"}}));
  out.push_back(serialize_safetensors({}));
  return out;
}

TEST(SafetensorsMalformed, TruncationsAreAlwaysRejected) {
  Outcome o;
  for (const auto& file : valid_files()) {
    ASSERT_TRUE(check(file, o, "valid"));
    for (size_t len = 0; len < file.size(); ++len) {
      std::vector<std::byte> cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_FALSE(check(cut, o, "truncated to " + std::to_string(len))) << len;
    }
    // One byte too many is a broken file too.
    std::vector<std::byte> longer = file;
    longer.push_back(std::byte{0});
    EXPECT_FALSE(check(longer, o, "one byte longer"));
  }
  EXPECT_GT(o.rejected, 2000);
}

TEST(SafetensorsMalformed, FlippedBytesAndHugeLengthsGiveCleanErrors) {
  Outcome o;
  Rng rng{42};
  for (const auto& base : valid_files()) {
    uint64_t header_end = 8;
    for (int i = 0; i < 8; ++i) header_end += static_cast<uint64_t>(base[static_cast<size_t>(i)]) << (8 * i);
    for (int v = 0; v < 1500; ++v) {
      std::vector<std::byte> f = base;
      int flips = 1 + static_cast<int>(rng.below(4));
      for (int k = 0; k < flips; ++k) {
        // Mostly inside the length and header, where the rules live.
        size_t at = rng.below(4) ? rng.below(static_cast<size_t>(std::min<uint64_t>(header_end, f.size()))) : rng.below(f.size());
        f[at] = static_cast<std::byte>(rng.next() & 0xff);
      }
      check(f, o, "flips");
    }
    const uint64_t lengths[] = {0, 1, 7, header_end - 9, header_end - 7, base.size() - 8, base.size() - 7, kMaxHeaderBytes,
                                kMaxHeaderBytes + 1, UINT64_MAX, UINT64_MAX - 7, 1ull << 63, (1ull << 32) + 2};
    for (uint64_t n : lengths) {
      std::vector<std::byte> f = base;
      for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
      check(f, o, "length " + std::to_string(n));
    }
  }
  EXPECT_GT(o.rejected, 1000);
}

TEST(SafetensorsMalformed, RewrittenHeadersGiveCleanErrors) {
  Outcome o;
  const std::string dtypes[] = {"F32", "f32", "F8_E4M3", "U16", "", "F64 ", "\"", "BOOL", "I16", "Q4"};
  const std::string numbers[] = {"0", "1", "8", "-1", "1.5", "1e30", "18446744073709551615", "18446744073709551616",
                                 "9223372036854775808", "4294967296", "\"8\"", "null", "[]", "{}", "true"};
  Rng rng{7};
  auto num = [&] { return numbers[rng.below(std::size(numbers))]; };
  for (int v = 0; v < 1500; ++v) {
    // Two tensors with random dtype, shape and offsets: overlaps, gaps, mismatched sizes.
    std::string h = "{";
    size_t tensors = 1 + rng.below(3);
    for (size_t t = 0; t < tensors; ++t) {
      if (t) h += ",";
      h += "\"t" + std::to_string(rng.below(2) ? t : 0) + "\":{\"dtype\":\"" + dtypes[rng.below(std::size(dtypes))] +
           "\",\"shape\":[" + (rng.below(3) ? std::to_string(rng.below(5)) : num()) + "],\"data_offsets\":[" +
           (rng.below(2) ? std::to_string(rng.below(24)) : num()) + "," + (rng.below(2) ? std::to_string(rng.below(24)) : num()) + "]}";
    }
    if (rng.below(4) == 0) h += ",\"__metadata__\":{\"k\":" + (rng.below(2) ? std::string("\"v\"") : num()) + "}";
    h += "}";
    if (rng.below(5) == 0) h.insert(rng.below(h.size()), 1, static_cast<char>(0x80 + rng.below(0x80)));  // non-UTF-8
    if (rng.below(8) == 0) h.erase(rng.below(h.size()), 1 + rng.below(4));                                 // bad JSON
    h.append(rng.below(9), ' ');
    check(with_header(h, rng.below(32)), o, h);
    // A valid control among the variants: the checks must not reject good files.
    size_t n = rng.below(6);
    const char* d = rng.below(2) ? "U8" : "BOOL";
    std::string good = fmt::format(R"({{"g":{{"dtype":"{}","shape":[{}],"data_offsets":[0,{}]}}}})", d, n, n);
    good.append(rng.below(9), ' ');
    EXPECT_TRUE(check(with_header(good, n), o, good)) << good;
  }
  // Pathological JSON: deep nesting, a huge string, a null byte, NaN.
  std::string deep(100000, '[');
  check(with_header("{\"a\":" + deep + std::string(100000, ']') + "}", 0), o, "deep");
  check(with_header("{\"a\":" + deep, 0), o, "deep unclosed");
  check(with_header("{\"" + std::string(1 << 20, 'x') + "\":1}", 0), o, "long key");
  check(with_header(std::string("{\"a\0\":1}", 8), 0), o, "null byte");
  check(with_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[NaN],\"data_offsets\":[0,0]}}", 0), o, "NaN");
  EXPECT_GT(o.rejected, 1200);
  EXPECT_GE(o.accepted, 1500);
}

}  // namespace
}  // namespace shardwise::ckpt
