// --val-fraction's cut of a corpus and the validation windows: tokens whose value is their own
// position in the corpus (file order) show exactly which tokens each side reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/data/data.h"
#include "tests/support/error_of.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

// Per process: ctest runs this file's tests in parallel processes, each writing its corpus.
fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-held-out-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Headerless uint16 tokens first, first + 1, ...: a token's value is its position in the corpus.
void write_positions(const fs::path& p, uint32_t first, uint32_t count) {
  std::ofstream out(p, std::ios::binary);
  for (uint32_t t = first; t < first + count; ++t) out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
}

// Three files of 700, 500 and 800 tokens (2000 in all); F = 0.3 holds out round(600) tokens:
// the cut is token 1400, inside the third file (which starts at 1200).
struct Corpus {
  fs::path dir = temp_dir("corpus");
  std::string glob;
  Corpus() {
    write_positions(dir / "a.bin", 0, 700);
    write_positions(dir / "b.bin", 700, 500);
    write_positions(dir / "c.bin", 1200, 800);
    glob = (dir / "*.bin").string();
  }
};

constexpr int64_t kSeq = 16, kCut = 1400, kTotal = 2000;

TEST(HeldOut, TrainingWindowsStayBeforeTheCutAndNeverCrossIt) {
  Corpus c;
  TokenFile training(c.glob, kSeq, 5, TokenFormat::Auto, {CorpusPart::Side::Training, 0.3});
  EXPECT_EQ(training.token_count(), kCut);
  // Window starts: 700 - 16 + 500 - 16 + 200 - 16 (the third file's 200 tokens before the cut).
  EXPECT_EQ(training.window_starts(), 684u + 484u + 184u);
  EXPECT_NE(training.describe().find("training part: tokens [0, 1400) of 2000"), std::string::npos) << training.describe();
  std::vector<int64_t> w(kSeq + 1);
  int64_t highest = 0;
  std::set<int64_t> files;
  for (int64_t i = 0; i < 3000; ++i) {
    training.sample(i, w);
    for (size_t k = 1; k < w.size(); ++k) ASSERT_EQ(w[k], w[k - 1] + 1) << "sample " << i << " is not one window";
    ASSERT_LT(w.back(), kCut) << "training sample " << i << " reads a held-out token";
    highest = std::max(highest, w.back());
    files.insert(w[0] < 700 ? 0 : w[0] < 1200 ? 1 : 2);
  }
  EXPECT_EQ(files.size(), 3u);  // the straddling file's training tokens are drawn too
  EXPECT_GT(highest, kCut - 40);
}

TEST(HeldOut, ValidationWindowsLieAfterTheCutEvenlyAndAreFixed) {
  Corpus c;
  auto held = std::make_unique<TokenFile>(c.glob, kSeq, 5, TokenFormat::Auto, CorpusPart{CorpusPart::Side::HeldOut, 0.3});
  EXPECT_EQ(held->token_count(), kTotal - kCut);
  const uint64_t starts = held->window_starts();
  EXPECT_EQ(starts, static_cast<uint64_t>(kTotal - kCut - kSeq));
  EvenWindows val(std::move(held), 10);
  ASSERT_EQ(val.size(), 10);
  std::vector<int64_t> w(kSeq + 1);
  for (int64_t k = 0; k < val.size(); ++k) {
    val.sample(k, w);
    // Window k starts at position floor(k * P / n) of the held-out part, i.e. token cut + that.
    EXPECT_EQ(w[0], kCut + static_cast<int64_t>(static_cast<uint64_t>(k) * starts / 10)) << k;
    EXPECT_EQ(w.back(), w[0] + kSeq);
  }
  // Another seed: the same validation windows.
  EvenWindows other(std::make_unique<TokenFile>(c.glob, kSeq, 99, TokenFormat::Auto,
                                                CorpusPart{CorpusPart::Side::HeldOut, 0.3}),
                    10);
  std::vector<int64_t> v(kSeq + 1);
  for (int64_t k = 0; k < 10; ++k) {
    val.sample(k, w), other.sample(k, v);
    EXPECT_EQ(w, v);
  }
  EXPECT_NE(error_of([&] { val.sample(10, w); }).find("validation sequence 10"), std::string::npos);
}

TEST(HeldOut, FewerDisjointWindowsThanAskedMeansAllOfThem) {
  Corpus c;
  // 600 held-out tokens, 584 window starts: 584 / 17 = 34 disjoint windows of 17 tokens.
  EvenWindows val(std::make_unique<TokenFile>(c.glob, kSeq, 5, TokenFormat::Auto,
                                              CorpusPart{CorpusPart::Side::HeldOut, 0.3}),
                  1000);
  ASSERT_EQ(val.size(), 34);
  std::vector<int64_t> w(kSeq + 1);
  int64_t end = -1;
  for (int64_t k = 0; k < val.size(); ++k) {
    val.sample(k, w);
    EXPECT_GT(w[0], end) << "validation windows " << k - 1 << " and " << k << " overlap";
    end = w.back();
  }
}

TEST(HeldOut, WithoutAPartTheCorpusSamplesAsBefore) {
  Corpus c;
  TokenFile whole(c.glob, kSeq, 5), zero(c.glob, kSeq, 5, TokenFormat::Auto, {CorpusPart::Side::Whole, 0});
  EXPECT_EQ(whole.token_count(), kTotal);
  EXPECT_EQ(whole.window_starts(), 684u + 484u + 784u);
  std::vector<int64_t> a(kSeq + 1), b(kSeq + 1);
  for (int64_t i = 0; i < 100; ++i) {
    whole.sample(i, a), zero.sample(i, b);
    EXPECT_EQ(a, b);
  }
}

TEST(HeldOut, AFractionThatLeavesASideNoWindowIsRefused) {
  Corpus c;
  // 0.004 x 2000 = 8 held-out tokens: no window of 17.
  const std::string small = error_of([&] { TokenFile(c.glob, kSeq, 5, TokenFormat::Auto, {CorpusPart::Side::HeldOut, 0.004}); });
  EXPECT_NE(small.find("--val-fraction 0.004 leaves the validation part"), std::string::npos) << small;
  EXPECT_NE(small.find("8 tokens"), std::string::npos) << small;
  EXPECT_NE(small.find("larger --val-fraction"), std::string::npos) << small;
  // 0.995: the training side keeps 10 tokens.
  const std::string big = error_of([&] { TokenFile(c.glob, kSeq, 5, TokenFormat::Auto, {CorpusPart::Side::Training, 0.995}); });
  EXPECT_NE(big.find("--val-fraction 0.995 leaves the training part"), std::string::npos) << big;
  EXPECT_NE(big.find("smaller --val-fraction"), std::string::npos) << big;
  const std::string range = error_of([&] { TokenFile(c.glob, kSeq, 5, TokenFormat::Auto, {CorpusPart::Side::Training, 1.0}); });
  EXPECT_NE(range.find("--val-fraction must be in (0, 1), got 1"), std::string::npos) << range;
}

}  // namespace
}  // namespace shardwise::train
