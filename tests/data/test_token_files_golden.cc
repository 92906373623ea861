// Token files written by other tools' code (tests/golden/token_files.py, numpy: nanoGPT's
// headerless uint16 .bin and llm.c's write_datafile format, versions 1 and 2) read as the ids the
// script wrote (tests/golden/tokens/tokens.json), with --data-format auto deciding by content, and
// the nanoGPT and llm.c files sample the same windows.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardwise/data/data.h"

namespace shardwise::train {
namespace {

const std::string kDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/tokens/";

TEST(TokenFilesGolden, NanoGptAndLlmcFilesHoldTheScriptsIds) {
  std::ifstream in(kDir + "tokens.json");
  const nlohmann::json want = nlohmann::json::parse(in);
  const auto ids = want["ids"].get<std::vector<int64_t>>();
  const int64_t offset = want["u32_offset"].get<int64_t>();
  TokenFile nano(kDir + "nanogpt.bin", 16, 7), u16(kDir + "llmc_u16.bin", 16, 7), u32(kDir + "llmc_u32.bin", 16, 7);
  EXPECT_EQ(nano.format(), TokenFormat::U16);
  EXPECT_EQ(u16.format(), TokenFormat::Llmc);
  EXPECT_EQ(u32.format(), TokenFormat::Llmc);
  ASSERT_EQ(nano.token_count(), static_cast<int64_t>(ids.size()));
  ASSERT_EQ(u16.token_count(), static_cast<int64_t>(ids.size()));
  ASSERT_EQ(u32.token_count(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(nano.token(0, static_cast<int64_t>(i)), ids[i]) << i;
    ASSERT_EQ(u16.token(0, static_cast<int64_t>(i)), ids[i]) << i;
    ASSERT_EQ(u32.token(0, static_cast<int64_t>(i)), ids[i] + offset) << i;
  }
  EXPECT_EQ(nano.vocab_needed(), 50257);  // the end-of-text id is the largest
  std::vector<int64_t> a(17), b(17);
  for (int64_t s = 0; s < 50; ++s) {
    nano.sample(s, a);
    u16.sample(s, b);
    ASSERT_EQ(a, b) << "sample " << s;
  }
}

}  // namespace
}  // namespace shardwise::train
