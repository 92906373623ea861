// Data order: sample i is a function of (seed, i) only, so a batch is the same whatever the mesh
// and a run resumes from consumed_samples alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "shardwise/core/error.h"
#include "shardwise/data/data.h"

namespace shardwise::train {
namespace {

TEST(Data, AdditionProblemsAreWellFormedAndHeldOutOnesNeverTrain) {
  AdditionTask task(2, 9, 7);
  std::vector<int64_t> tokens(10);
  std::set<std::string> train_problems;
  for (int64_t i = 0; i < 2000; ++i) {
    task.sample(i, tokens);
    std::string text(tokens.begin(), tokens.end());
    auto plus = text.find('+'), eq = text.find('='), nl = text.find('\n');
    ASSERT_NE(plus, std::string::npos) << text;
    int a = std::stoi(text.substr(0, plus)), b = std::stoi(text.substr(plus + 1, eq - plus - 1));
    EXPECT_EQ(std::stoi(text.substr(eq + 1, nl - eq - 1)), a + b) << text;
    train_problems.insert(text.substr(0, eq));
  }
  for (int64_t k = 0; k < 200; ++k) {
    auto p = task.held_out(k);
    std::string text(p.tokens.begin(), p.tokens.end());
    EXPECT_FALSE(train_problems.count(text.substr(0, text.find('=')))) << text;
    // labels[t] = tokens[t + 1]: the answer (digits and newline) starts right after '='.
    EXPECT_EQ(p.tokens[static_cast<size_t>(p.answer_begin)], '=');
    EXPECT_EQ(p.tokens[static_cast<size_t>(p.answer_end)], '\n');
  }
}

TEST(Data, BatchesDependOnlyOnTheSampleIndex) {
  AdditionTask task(3, 12, 99);
  Batch whole = make_batch(task, 100, 8, 12);
  Batch tail = make_batch(task, 104, 4, 12);  // what a resumed run or another rank asks for
  for (int64_t i = 0; i < 4 * 12; ++i) {
    EXPECT_EQ(tail.ids.data<int64_t>()[i], whole.ids.data<int64_t>()[4 * 12 + i]);
    EXPECT_EQ(tail.labels.data<int64_t>()[i], whole.labels.data<int64_t>()[4 * 12 + i]);
  }
  // labels are the inputs shifted by one
  EXPECT_EQ(whole.labels.data<int64_t>()[0], whole.ids.data<int64_t>()[1]);
}

TEST(Data, TextAndUint16FilesGiveWindowsOfTheirTokens) {
  auto dir = std::filesystem::temp_directory_path();
  std::string text = "the quick brown fox jumps over the lazy dog, again and again and again.";
  { std::ofstream(dir / "shardwise-data.txt") << text; }
  TokenFile bytes((dir / "shardwise-data.txt").string(), 8, 3);
  std::vector<int64_t> w(9);
  for (int64_t i = 0; i < 50; ++i) {
    bytes.sample(i, w);
    std::string got(w.begin(), w.end());
    EXPECT_NE(text.find(got), std::string::npos) << got;
  }
  {
    std::ofstream bin(dir / "shardwise-data.bin", std::ios::binary);
    for (uint16_t t = 0; t < 1000; ++t) bin.put(static_cast<char>(t * 7 & 0xFF)).put(static_cast<char>(t * 7 >> 8));
  }
  TokenFile tokens((dir / "shardwise-data.bin").string(), 16, 3);
  EXPECT_EQ(tokens.vocab_needed(), 999 * 7 + 1);
  EXPECT_THROW(tokens.sample(5, w), Error);  // 9 slots for a window of 17 tokens
  std::vector<int64_t> w17(17);
  tokens.sample(5, w17);
  for (size_t i = 1; i < w17.size(); ++i) EXPECT_EQ(w17[i] - w17[i - 1], 7);  // consecutive tokens
  EXPECT_THROW(TokenFile("/nonexistent/x.txt", 8, 1), Error);
  { std::ofstream(dir / "shardwise-short.txt") << "tiny"; }
  try {
    TokenFile((dir / "shardwise-short.txt").string(), 8, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 4 tokens; sequences of 8 need at least 9"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::train
