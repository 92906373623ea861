// The words of what the commands print: a count of one takes the singular ("1 rank", never "1 ranks").
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "run_cli.h"

namespace {

using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

// Every "1 <plural>" of the nouns shardwise counts ("" when none).
std::string one_with_plural(const std::string& out) {
  static const std::regex bad(
      "(^|[^0-9.])1 (ranks|steps|layers|heads|micro-batches|sequences|tensors|files|checkpoints|stages|processes|"
      "documents|threads|cases|calls|problems|prompts|tokens|new tokens|pipeline ranks|virtual stages)\\b");
  std::smatch m;
  return std::regex_search(out, m, bad) ? m[0].str() : "";
}

TEST(CliWording, ACountOfOneTakesTheSingular) {
  const std::string dir = tmp("wording_one");
  Result r = run("train --ranks 1 --mesh dp=1 --steps 1 --layers 1 --heads 1 --hidden 16 --global-batch 2 "
                 "--eval-every 0 --save-every 1 --progress lines --run-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1 layer, hidden 16, 1 head,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(1 rank, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 1 step in"), std::string::npos) << r.out;
  EXPECT_EQ(one_with_plural(r.out), "") << r.out;
  Result inspect = run("ckpt inspect " + dir + "/checkpoints/checkpoint-1");
  ASSERT_EQ(inspect.status, 0) << inspect.out;
  EXPECT_EQ(one_with_plural(inspect.out), "") << inspect.out;
  Result pipe = run("pipeline --schedule 1f1b --stages 1 --micro-batches 1");
  ASSERT_EQ(pipe.status, 0) << pipe.out;
  EXPECT_NE(pipe.out.find("1 rank x 1 virtual stage = 1 stage, 1 micro-batch"), std::string::npos) << pipe.out;
  EXPECT_EQ(one_with_plural(pipe.out), "") << pipe.out;
  Result zb = run("pipeline --schedule zbh1 --stages 2 --micro-batches 1");
  EXPECT_NE(zb.out.find("zbh1: 1 micro-batch for 2 pipeline ranks"), std::string::npos) << zb.out;
}

// Every command's --help is free of CLI11's artefacts: no flag values after a flag's names
// ("--no-eos-between-documents{false}") and no "TEXT:{a,b}" for a choice (it reads "a|b").
TEST(CliWording, HelpHasNoCli11Artefacts) {
  for (const char* command : {"train", "generate", "plan", "pipeline", "tokenize", "gemm-check", "ckpt inspect",
                              "ckpt verify", "ckpt merge", "ckpt convert", "ckpt lora-merge", "verify", "infer",
                              "rules", "plan-reshard", ""}) {
    Result r = run(std::string(command) + " --help");
    EXPECT_EQ(r.status, 0) << command << "\n" << r.out;
    EXPECT_EQ(r.out.find('{'), std::string::npos) << command << "\n" << r.out;
  }
  Result train = run("train --help");
  EXPECT_NE(train.out.find("  --model gpt2|llama=gpt2 "), std::string::npos) << train.out;
  EXPECT_NE(run("tokenize --help").out.find("  --eos-between-documents,--no-eos-between-documents\n"), std::string::npos);
}

}  // namespace
