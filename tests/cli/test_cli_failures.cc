// What `shardwise` does when things go wrong (issue 13): a --config file that is read and checked,
// usage errors as one `shardwise: error:` line with exit status 2 and a suggestion, documented
// upper bounds instead of crashes and hangs, progress lines without terminal control codes.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

using shardwise_cli_test::lines;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::tmp;

const std::string kSmall = "--mesh dp=2 --layers 1 --hidden 32 --global-batch 16 --eval-every 0";

std::string write_config(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

void expect_usage_error(const std::string& args, const std::string& message) {
  Result r = run(args);
  EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
  EXPECT_EQ(lines(r.out), 1) << args << "\n" << r.out;
  EXPECT_EQ(r.out.rfind("shardwise: error: ", 0), 0u) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
}

TEST(CliFailures, ConfigFileKeysChangeTheRunAndTheCommandLineWins) {
  std::string cfg = write_config("three_steps.toml",
                                 "# a comment\n[train]\nsteps = 3  # three\nlr = 0.003\nrun-dir = \"" + tmp("sw-cfg-run") + "\"\n"
                                 "sp = false\n");
  Result r = run("train --config " + cfg + " " + kSmall);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr 0.003"), std::string::npos) << r.out;
  r = run("train --config " + cfg + " --steps 2 " + kSmall);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
}

TEST(CliFailures, ConfigFileErrorsNameTheKeyAndTheLine) {
  struct Bad {
    std::string name, text, message;  // the message after "<file> line N: "
  };
  for (const Bad& b : std::vector<Bad>{
           {"unknown.toml", "steps = 3\nstpes = 4\n", "line 2: unknown key 'stpes' (did you mean 'steps'?)"},
           {"type.toml", "\n\nsteps = \"ten\"\n", "line 3: key 'steps' expects an integer, got \"ten\""},
           {"float.toml", "layers = 3.5\n", "line 1: key 'layers' expects an integer, got 3.5"},
           {"mesh.toml", "mesh = dp=2\n", "line 1: key 'mesh' expects a string in double quotes"},
           {"flag.toml", "sp = 1\n", "line 1: key 'sp' is a flag: expected true or false, got 1"},
           {"section.toml", "[modle]\nlayers = 1\n", "line 1: section [modle]: use ["},
           {"twice.toml", "steps = 3\nsteps = 4\n", "line 2: key 'steps' is given twice"},
       }) {
    std::string path = write_config(b.name, b.text);
    // --steps 1: a file that were not refused would run briefly
    expect_usage_error("train --steps 1 --run-dir " + tmp("shardwise-cli-cfg") + " --config " + path, path + " " + b.message);
  }
  expect_usage_error("train --config /nonexistent/run.toml", "cannot read the config file '/nonexistent/run.toml'");
  expect_usage_error("train --config /tmp", "--config '/tmp' is a directory");
}

TEST(CliFailures, UsageErrorsAreOneLineWithExitStatus2AndASuggestion) {
  expect_usage_error("trian", "unknown command 'trian' for `shardwise` (did you mean 'train'?)");
  expect_usage_error("train --stpes 10", "unknown option '--stpes' for `shardwise train` (did you mean '--steps'?)");
  expect_usage_error("ckpt inpsect x", "unknown command 'inpsect' for `shardwise ckpt` (did you mean 'inspect'?)");
  expect_usage_error("", "`shardwise` needs a command: rules, infer");
  expect_usage_error("train --steps ten", "--steps");
  expect_usage_error("infer exp --mesh 2 --shapes 4 --placements R --part sideways", "--part");
  Result help = run("train --help");
  EXPECT_EQ(help.status, 0) << help.out;
  EXPECT_NE(help.out.find("--steps"), std::string::npos) << help.out;
  EXPECT_EQ(run("--version").status, 0);
}

void expect_refused(const std::string& args, const std::string& message) {
  Result r = run(args + (args.starts_with("train") ? " --run-dir " + tmp("shardwise-cli-refused") : ""));
  EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
  EXPECT_EQ(lines(r.out), 1) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("shardwise: error: " + message), std::string::npos) << args << "\n" << r.out;
}

TEST(CliFailures, TrainRefusesValuesItUsedToAcceptSilently) {
  expect_refused("train --mesh dp=2 --schedule zbh1", "--schedule zbh1 --virtual 1 need a pipeline: mesh [dp=2] has no pp dim");
  expect_refused("train --mesh dp=2 --schedule nosuch", "unknown pipeline schedule 'nosuch'");
  expect_refused("train --save-every -1", "--save-every must be 0 or a positive number, got -1");
  expect_refused("train --eval-every -5", "--eval-every must be 0 or a positive number, got -5");
  expect_refused("train --progress fancy", "--progress 'fancy': use auto, bar, lines or none");
  expect_refused("train --steps 99999999999999999999", "--steps: 99999999999999999999 does not fit in a 64-bit integer");
  expect_refused("train --recompute some", "--recompute 'some' is not a recompute mode (none, full, selective)");
  expect_refused("train --recompute full --recompute-layers 0", "--recompute-layers must be at least 1");
  expect_refused("train --recompute-layers 2", "--recompute-layers 2 needs --recompute full or selective (it is none)");
  expect_refused("train --attention flash", "--attention 'flash' is not an attention mode (fused, unfused)");
  expect_refused("train --lm-head chunked", "--lm-head 'chunked' is not a head (fused, unfused)");
}

TEST(CliFailures, UnknownShardingStagesAndLayoutsAreRefused) {
  expect_usage_error("train --sharding-stage 4 " + kSmall, "--sharding-stage must be 0 (none), 1 (optimizer state)");
  expect_usage_error("train --sharding-stage 1 --sharding-layout v3 " + kSmall, "--sharding-layout must be v1");
  // The same keys in a config file.
  std::string cfg = write_config("sharding.toml", "sharding-stage = 2\nsharding-layout = \"v2\"\nsteps = 2\n"
                                                  "run-dir = \"" + tmp("sw-cfg-sharding") + "\"\n");
  Result r = run("train --config " + cfg + " " + kSmall);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("sharding: stage 2, layout v2"), std::string::npos) << r.out;
  std::string cfg3 = write_config("sharding3.toml", "sharding-stage = 3\nsteps = 2\n"
                                                    "run-dir = \"" + tmp("sw-cfg-sharding3") + "\"\n");
  Result r3 = run("train --config " + cfg3 + " " + kSmall);
  ASSERT_EQ(r3.status, 0) << r3.out;
  EXPECT_NE(r3.out.find("sharding: stage 3, parameters, gradients and optimizer state split over dp"), std::string::npos)
      << r3.out;
}

TEST(CliFailures, CrashesAndHangsBecomeDocumentedBounds) {
  expect_refused("train --data /tmp", "--data '/tmp' is a directory; expected a text file");
  expect_refused("train --mesh dp=1 --hidden 1048576 --heads 4",
                 "parameter transformer.h.0.mlp.c_fc.weight (1048576x4194304) needs 16384.0 GiB in f32");
  expect_refused("pipeline --stages 4096 --micro-batches 100000", "--stages 4096: use 1 to 1024");
  expect_refused("pipeline --stages 1024 --micro-batches 16384", "--stages 1024 x --virtual 1 x --micro-batches 16384 = 16777216: at most 65536 in one schedule");
  expect_refused("infer exp --mesh 100000000 --shapes 4 --placements R",
                 "mesh '100000000' has more than 1048576 ranks; shardwise supports at most 1048576");
  expect_refused("infer exp --mesh 4097 --shapes 4 --placements R",
                 "mesh [4097] has 4097 ranks; infer lists each rank's block, for at most 4096 ranks");
  expect_refused("infer exp --mesh 2,2,2,2,2,2,2,2,2 --shapes 4 --placements R",
                 "mesh '2,2,2,2,2,2,2,2,2' has more than 8 dims; shardwise supports at most 8");
  expect_refused("infer exp --mesh 2 --shapes 1x1x1x1x1x1x1x1x1 --placements R",
                 "a shape with more than 8 dims: shardwise supports at most 8");
  Result help = run("pipeline --help");
  EXPECT_NE(help.out.find("1 to 1024"), std::string::npos) << help.out;
}

TEST(CliFailures, ProgressIsPlainLinesOffATerminalAndBarOnRequest) {
  const std::string args = "train --mesh dp=1 --layers 1 --hidden 32 --steps 4 --global-batch 8 --eval-every 2 "
                           "--run-dir " + tmp("shardwise-cli-progress");
  Result plain = run(args);
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_EQ(plain.out.find('\r'), std::string::npos) << plain.out;
  EXPECT_EQ(plain.out.find("\033[K"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("step     2/4"), std::string::npos) << plain.out;
  Result bar = run(args + " --progress bar");
  ASSERT_EQ(bar.status, 0) << bar.out;
  // Each line that carries a new accuracy stays: it ends with a newline, not the next \r.
  EXPECT_NE(bar.out.find("\033[K\n"), std::string::npos) << bar.out;
  EXPECT_NE(bar.out.find("acc "), std::string::npos) << bar.out;
  Result none = run(args + " --progress none");
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_EQ(none.out.find("step "), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("done: 4 steps"), std::string::npos) << none.out;
}

TEST(CliFailures, UnderMpirunAConfigurationErrorIsPrintedOnce) {
  Result r = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) +
                                             " -np 2 $SHARDWISE_BIN train --mesh dp=2 --steps 0");
  EXPECT_NE(r.status, 0) << r.out;
  size_t first = r.out.find("shardwise: error: steps must be at least 1, got 0");
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("shardwise: error:", first + 1), std::string::npos) << r.out;
  // The data's checks run on the processes that read it (process 1, tp's second rank, never opens
  // it) and end every process alike: still one line.
  const std::string data = tmp("shardwise-cli-mpi-vocab.bin");  // u16 tokens 0..127
  {
    std::ofstream out(data, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 400; ++i) out.put(static_cast<char>(i % 128)).put('\0');
  }
  r = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 $SHARDWISE_BIN train --mesh tp=2 " +
                                      "--steps 1 --seq 16 --vocab 64 --data " + data);
  EXPECT_NE(r.status, 0) << r.out;
  first = r.out.find("needs a vocabulary of 128 tokens, the model has 64 (--vocab)");
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("shardwise: error:", first + 1), std::string::npos) << r.out;
}

}  // namespace

namespace {

// Every rank finds the same non-finite loss at the same step: the job prints one error line.
TEST(CliFailures, UnderMpirunATrainingErrorIsPrintedOnce) {
  Result r = shardwise_cli_test::run_command(
      std::string(SHARDWISE_MPIRUN_LINE) +
      " -np 2 $SHARDWISE_BIN train --mesh dp=2 --layers 1 --hidden 32 --digits 2 --global-batch 8 --steps 40 "
      "--lr 1e6 --min-lr 0 --warmup 0 --clip 0 --run-dir " + tmp("shardwise-cli-mpi-nonfinite"));
  EXPECT_NE(r.status, 0) << r.out;
  size_t first = r.out.find("shardwise: error: rank ");
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is not finite", first), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("shardwise: error:", first + 1), std::string::npos) << r.out;
}

}  // namespace
