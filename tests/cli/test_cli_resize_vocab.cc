// `train --init-from` a model whose tokenizer holds added tokens (tests/golden/hf/resize_llama_tiny:
// vocab_size 99, a tokenizer.json of 101 ids, tools/hf_resize_vocab.py) grows the vocabulary to the
// tokenizer's ids, or to --resize-vocab N; the checkpoint says so in config.json, keeps the
// tokenizer and resumes; shrinking and a size below the tokenizer's are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::run;

const std::string kGolden = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";
const std::string kTrain = "train --init-from " + kGolden + "/resize_llama_tiny --data " + kGolden +
                           "/resize_tokens.bin --global-batch 4 --eval-every 0 --progress none ";

struct TempDir : shardwise_cli_test::TempDir {
  TempDir() : shardwise_cli_test::TempDir("sw_cli_resize_vocab") { fs::create_directories(path); }
};

nlohmann::json read_json(const fs::path& file) {
  std::ifstream f(file);
  return nlohmann::json::parse(f);
}

std::string bytes_of(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(CliResizeVocab, TheTokenizersAddedTokensGrowTheModelWhichSavesAndResumes) {
  TempDir d;
  const std::string dir = (d.path / "run").string();
  auto r = run(kTrain + "--mesh tp=2 --steps 2 --save-every 2 --run-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("vocabulary grown from 99 to 101 tokens (the tokenizer's added tokens)"), std::string::npos)
      << r.out;
  const fs::path ckpt = d.path / "run" / "checkpoints" / "checkpoint-2";
  EXPECT_EQ(read_json(ckpt / "config.json")["vocab_size"], 101);
  EXPECT_EQ(bytes_of(ckpt / "tokenizer.json"), bytes_of(kGolden + "/resize_llama_tiny/tokenizer.json"));
  r = run(kTrain + "--mesh pp=2 --steps 3 --save-every 3 --resume auto --run-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_json(d.path / "run" / "checkpoints" / "checkpoint-3" / "config.json")["vocab_size"], 101);
  r = run("generate --checkpoint " + (d.path / "run" / "checkpoints" / "checkpoint-3").string() +
          " --prompt-ids 99,3,100 --max-new-tokens 2");  // the added ids are in the vocabulary
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST(CliResizeVocab, ResizeVocabSetsTheSizeAndShrinkingOrFewerThanTheTokenizersIdsIsRefused) {
  TempDir d;
  auto r = run(kTrain + "--steps 1 --save-every 1 --resize-vocab 128 --run-dir " + (d.path / "run").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("vocabulary grown from 99 to 128 tokens (--resize-vocab)"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(d.path / "run" / "checkpoints" / "checkpoint-1" / "config.json")["vocab_size"], 128);
  r = run(kTrain + "--steps 1 --resize-vocab 98");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--resize-vocab 98 is below the vocab_size 99 of --init-from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("shrinking the vocabulary is refused"), std::string::npos) << r.out;
  r = run(kTrain + "--steps 1 --resize-vocab 100");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--resize-vocab 100 is below the 101 ids of the tokenizer"), std::string::npos) << r.out;
  // --vocab against a grown vocabulary names both sizes (it used to say "config.json has 101", which
  // holds 99).
  r = run(kTrain + "--steps 1 --vocab 99");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--vocab 99 contradicts --init-from " + kGolden + "/resize_llama_tiny, whose model trains 101 "
                       "tokens (its config.json's vocab_size 99 grown for its tokenizer's added tokens)"),
            std::string::npos) << r.out;
  r = run("train --steps 1 --resize-vocab 300");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--resize-vocab 300 grows the vocabulary of an --init-from model: a fresh model's is --vocab"),
            std::string::npos) << r.out;
}

}  // namespace
