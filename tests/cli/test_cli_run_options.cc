// A checkpoint keeps the options of the run that wrote it (run_options.json) and its tokenizer
// (tokenizer.model): `--resume` needs no repeated flags (options given again override the stored
// ones and are named), and `generate` finds the tokenizer in the checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

const std::string kFables = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sw_cli_runopts_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const std::string kSmall = "train --layers 1 --hidden 32 --heads 2 --global-batch 8 --eval-every 0 --save-every 3 ";

// The interrupted run resumes with `--resume auto --steps 6` alone: the model shape, --save-every
// and the rest come from checkpoint-3, and steps 4-6 are the uninterrupted run's to the bit (the
// warm-up spans all six steps, so the schedule does not depend on --steps).
TEST(CliRunOptions, AResumeTakesTheCheckpointsOptionsAndContinuesTheSameRun) {
  const fs::path d = fresh_dir("resume");
  const std::string straight = (d / "straight").string(), cut = (d / "cut").string();
  ASSERT_EQ(run(kSmall + "--steps 6 --run-dir " + straight).status, 0);
  ASSERT_EQ(run(kSmall + "--steps 3 --run-dir " + cut).status, 0);
  const nlohmann::json stored = nlohmann::json::parse(read(fs::path(cut) / "checkpoints/checkpoint-3/run_options.json"));
  EXPECT_EQ(stored["options"]["save-every"], nlohmann::json({"3"})) << stored.dump();
  EXPECT_EQ(stored["options"]["hidden"], nlohmann::json({"32"})) << stored.dump();
  EXPECT_FALSE(stored["options"].contains("resume")) << stored.dump();
  Result r = run("train --resume auto --steps 6 --run-dir " + cut);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--steps 6 overrides the checkpoint's 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--save-every 3"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(fs::path(cut) / "checkpoints/checkpoint-6/manifest.json")) << r.out;  // --save-every kept
  const std::vector<std::string> a = shardwise_cli_test::metrics_losses(fs::path(straight) / "metrics.jsonl"),
                                 b = shardwise_cli_test::metrics_losses(fs::path(cut) / "metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  // The checkpoint of the resumed run keeps the options it ran with, the override included.
  const nlohmann::json again = nlohmann::json::parse(read(fs::path(cut) / "checkpoints/checkpoint-6/run_options.json"));
  EXPECT_EQ(again["options"]["steps"], nlohmann::json({"6"})) << again.dump();
  EXPECT_EQ(again["options"]["layers"], nlohmann::json({"1"})) << again.dump();
  fs::remove_all(d);
}

TEST(CliRunOptions, AnOptionGivenAgainOverridesTheCheckpointsAndAShapeChangeIsRefusedByName) {
  const fs::path d = fresh_dir("override");
  const std::string run_dir = (d / "run").string();
  ASSERT_EQ(run(kSmall + "--steps 3 --lr 0.002 --run-dir " + run_dir).status, 0);
  Result r = run("train --resume auto --steps 5 --lr 0.001 --run-dir " + run_dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--lr 0.001 overrides the checkpoint's 0.002"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr 0.001 "), std::string::npos) << r.out;  // the header: what runs
  // An option the first run left at its default is named with the default.
  r = run("train --resume auto --steps 7 --warmup 10 --run-dir " + run_dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--warmup 10 overrides the checkpoint's 50 (the default)"), std::string::npos) << r.out;
  // The model's shape cannot change on a resume: refused as before, naming the field.
  r = run("train --resume auto --steps 9 --hidden 64 --run-dir " + run_dir);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("holds another model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n_embd 32 (checkpoint) vs 64 (this run)"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// A Llama run with a SentencePiece tokenizer and an untied head: the checkpoint holds the
// tokenizer byte for byte (with transformers' tokenizer_config.json); with the original model file
// gone, `generate` decodes with the checkpoint's copy exactly as with --tokenizer, and a resume
// needs neither --tokenizer nor the model's options again.
TEST(CliRunOptions, TheCheckpointKeepsTheTokenizerForGenerateAndResume) {
  const fs::path d = fresh_dir("tokenizer");
  ASSERT_EQ(run("tokenize --train-model --in " + kFables + " --vocab-size 400 --model-prefix " + (d / "tok").string())
                .status, 0);
  // A copy under the same name (the data fingerprint names the tokenizer's file).
  const fs::path tok = d / "tok.model", kept = d / "kept" / "tok.model";
  fs::create_directories(kept.parent_path());
  fs::copy_file(tok, kept);
  const std::string run_dir = (d / "run").string();
  Result r = run("train --model llama --kv-heads 1 --untied-head --layers 1 --hidden 32 --heads 2 --seq 32 "
                 "--global-batch 4 --mesh dp=1 --steps 2 --save-every 2 --documents paragraphs --data " + kFables +
                 " --tokenizer " + tok.string() + " --run-dir " + run_dir);
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path ckpt = fs::path(run_dir) / "checkpoints/checkpoint-2";
  EXPECT_EQ(read(ckpt / "tokenizer.model"), read(tok));
  const nlohmann::json config = nlohmann::json::parse(read(ckpt / "tokenizer_config.json"));
  EXPECT_EQ(config["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(config["eos_token"], "</s>");
  // The resume repeats nothing: the model, the data and its tokenizer come from checkpoint-2.
  r = run("train --resume auto --steps 4 --run-dir " + run_dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("untied head"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(fs::path(run_dir) / "checkpoints/checkpoint-4/tokenizer.model")) << r.out;
  // With the model file gone, generate decodes with the checkpoint's copy as with --tokenizer.
  fs::remove(tok);
  const std::string gen = "generate --checkpoint " + ckpt.string() + " --prompt 'The fox' --max-new-tokens 6 --json";
  Result with_copy = run(gen), with_file = run(gen + " --tokenizer " + kept.string());
  ASSERT_EQ(with_copy.status, 0) << with_copy.out;
  ASSERT_EQ(with_file.status, 0) << with_file.out;
  auto sequences = [](const std::string& out) { return nlohmann::json::parse(out.substr(0, out.find('\n')))["sequences"]; };
  EXPECT_EQ(sequences(with_copy.out), sequences(with_file.out));
  EXPECT_EQ(sequences(with_copy.out)[0]["new_ids"].size(), 6u) << with_copy.out;
  // A resume whose stored --tokenizer is gone says where the copy is.
  r = run("train --resume auto --steps 6 --run-dir " + run_dir);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--tokenizer " + tok.string() + " that checkpoint-4 was trained with is gone"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint-4/tokenizer.model"), std::string::npos) << r.out;
  r = run("train --resume auto --steps 6 --run-dir " + run_dir + " --tokenizer " + kept.string());
  EXPECT_EQ(r.status, 0) << r.out;
  fs::remove_all(d);
}

}  // namespace
