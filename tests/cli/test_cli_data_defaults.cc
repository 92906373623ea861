// What a `train --data` run takes from its data when the options leave it out: the vocabulary (the
// data's or the tokenizer's, rounded up to a multiple of 64), the step count (one epoch, or
// --epochs / --tokens), a pipeline's micro-batches (as many as stages); and when progress lines
// go out off a terminal, and the warning about a run over an hour.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"
#include "shardwise/cli/train/progress.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

const std::string kFables = std::string(SHARDWISE_SOURCE_DIR) + "/tests/data/fables.txt";

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sw_cli_defaults_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// `n` bytes cycling through `alphabet`.
void write_text(const fs::path& p, size_t n, const std::string& alphabet) {
  std::ofstream f(p, std::ios::binary);
  for (size_t i = 0; i < n; ++i) f.put(alphabet[(i * 7 + i / 5) % alphabet.size()]);
}

int metrics_lines(const fs::path& run_dir) {
  std::ifstream f(run_dir / "metrics.jsonl");
  int n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

const std::string kSmall = "train --layers 1 --hidden 32 --heads 2 --global-batch 4 --seq 16 --eval-every 0 --mesh dp=1 ";

// Bytes up to 0xC8 need 201 ids: the model gets 256 where it refused with 128 before; an explicit
// --vocab that is too small is still refused.
TEST(CliDataDefaults, TheVocabularyComesFromTheDataRoundedUpToAMultipleOf64) {
  const fs::path d = fresh_dir("vocab");
  write_text(d / "notes.txt", 3000, std::string("abcdefghij klmnop\n") + static_cast<char>(0xC8));
  Result r = run(kSmall + "--steps 2 --data " + (d / "notes.txt").string() + " --run-dir " + (d / "a").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("vocab 256: the data needs 201 ids, rounded up to a multiple of 64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", vocab 256: "), std::string::npos) << r.out;
  r = run(kSmall + "--steps 2 --vocab 128 --data " + (d / "notes.txt").string() + " --run-dir " + (d / "b").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("needs a vocabulary of 201 tokens, the model has 128 (--vocab)"), std::string::npos) << r.out;
  // A tokenizer's 400 pieces: 448.
  ASSERT_EQ(run("tokenize --train-model --in " + kFables + " --vocab-size 400 --model-prefix " + (d / "tok").string())
                .status, 0);
  r = run(kSmall + "--steps 1 --data " + kFables + " --tokenizer " + (d / "tok.model").string() + " --run-dir " +
          (d / "c").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("vocab 448: the tokenizer has 400 ids"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// 2000 tokens at 4 x 16 tokens a step: one epoch is ceil(2000 / 64) = 32 steps; --epochs 2 is 63;
// --tokens 640 is 10; --val-fraction 0.25 leaves 1500 training tokens: 24. Counted independently
// in metrics.jsonl, one line per step.
TEST(CliDataDefaults, WithoutStepsARunIsOneEpochOrTheBudgetGiven) {
  const fs::path d = fresh_dir("steps");
  const std::string data = (d / "text.txt").string();
  write_text(data, 2000, "abcdefgh ");
  struct Case {
    std::string extra, says;
    int steps;
  };
  const std::vector<Case> cases = {
      {"", "steps 32: one epoch of 2000 training tokens at 64 tokens a step (global batch 4 x seq 16)", 32},
      {"--epochs 2", "steps 63: --epochs 2 of 2000 training tokens", 63},
      {"--tokens 640", "steps 10: --tokens 640", 10},
      {"--val-fraction 0.25", "steps 24: one epoch of 1500 training tokens", 24}};
  for (const Case& c : cases) {
    const fs::path run_dir = d / ("run" + std::to_string(c.steps));
    Result r = run(kSmall + "--progress none --data " + data + " --run-dir " + run_dir.string() + " " + c.extra);
    ASSERT_EQ(r.status, 0) << c.extra << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.extra << r.out;
    EXPECT_EQ(metrics_lines(run_dir), c.steps) << c.extra;
  }
  Result r = run(kSmall + "--steps 5 --epochs 2 --data " + data + " --run-dir " + (d / "x").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--steps 5 and --epochs both set the run's length: give one"), std::string::npos) << r.out;
  r = run(kSmall + "--tokens 100 --run-dir " + (d / "y").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--tokens sets the steps from --data's size"), std::string::npos) << r.out;
  fs::remove_all(d);
}

// The README's `--mesh pp=2 --schedule zbh1`: without a batch split the pipeline gets as many
// micro-batches as stages (zbh1 refused 1 micro-batch for 2 ranks), and the run is the one that
// names --micro-batches 2 itself, loss for loss.
TEST(CliDataDefaults, APipelineDefaultsToAsManyMicroBatchesAsStages) {
  const fs::path d = fresh_dir("pp");
  const std::string base =
      "train --model llama --mesh pp=2 --schedule zbh1 --recompute selective --recompute-layers 2 --layers 2 "
      "--hidden 32 --heads 2 --global-batch 8 --steps 2 --eval-every 0 --run-dir ";
  Result a = run(base + (d / "a").string()), b = run(base + (d / "b").string() + " --micro-batches 2");
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(a.out.find("2 micro-batches per step"), std::string::npos) << a.out;
  EXPECT_EQ(shardwise_cli_test::metrics_losses(d / "a/metrics.jsonl"),
            shardwise_cli_test::metrics_losses(d / "b/metrics.jsonl"));
  fs::remove_all(d);
}

// Off a terminal the first line comes after step 1 (not after steps / 20 steps).
TEST(CliDataDefaults, TheFirstProgressLineComesAfterTheFirstStep) {
  const fs::path d = fresh_dir("first");
  Result r = run("train --layers 1 --hidden 32 --global-batch 8 --eval-every 0 --steps 40 --progress lines --run-dir " +
                 (d / "run").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step     1/40    2%  elapsed "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step     3/40 "), std::string::npos) << r.out;  // then every 2 steps
  fs::remove_all(d);
}

TEST(CliDataDefaults, AProgressLineGoesOutAtLeastOnceAMinute) {
  using shardwise::cli::progress_line_due;
  EXPECT_TRUE(progress_line_due({1, 0, 4500, 225, false, 0}));     // the run's first step
  EXPECT_TRUE(progress_line_due({301, 300, 4500, 225, false, 0}));  // a resumed run's first step
  EXPECT_FALSE(progress_line_due({7, 0, 4500, 225, false, 59.9}));
  EXPECT_TRUE(progress_line_due({7, 0, 4500, 225, false, 60}));
  EXPECT_TRUE(progress_line_due({450, 0, 4500, 225, false, 0}));
  EXPECT_TRUE(progress_line_due({4500, 0, 4500, 225, false, 0}));
  EXPECT_TRUE(progress_line_due({8, 0, 4500, 225, true, 0}));
}

// The printer as `train` drives it, with the elapsed times given: 100 steps, a line every 50; steps
// 2-4 come 70 s apart, so each gets a line (step 5, a second later, none); after step 2 the 98 steps left take 58 minutes, after
// step 3 (141 s for 3) 1h15m: the warning, before step 3's line, and not again.
TEST(CliDataDefaults, ThePrinterWarnsOnceAndPrintsAtLeastOnceAMinute) {
  std::ostringstream out;
  shardwise::cli::ProgressPrinter p(out, shardwise::cli::ProgressPrinter::Mode::Lines, 0, 100, 50);
  const std::vector<double> elapsed = {1, 71, 141, 211, 212};
  for (int64_t s = 1; s <= 5; ++s) p.step("line " + std::to_string(s), s, false, elapsed[static_cast<size_t>(s - 1)]);
  EXPECT_EQ(out.str(),
            "line 1\nline 2\nwarning: at 47 s a step the 97 steps left take about 1h15m (over an hour): --steps, "
            "--epochs or --tokens sets a shorter run\nline 3\nline 4\n");
}

// The progress line: a 20-character bar on a terminal, the percentage done (rounded down), the time
// since this run's first step and the time left at its speed (a resumed run counts its own steps).
TEST(CliDataDefaults, TheProgressLineShowsABarThePercentageAndTheElapsedTime) {
  using shardwise::cli::progress_text;
  EXPECT_EQ(progress_text({126, 0, 300, 65, "loss 1.2345"}, false),
            "step   126/300   42%  elapsed 1m05s  ETA 1m30s  loss 1.2345");
  EXPECT_EQ(progress_text({126, 0, 300, 65, "loss 1.2345"}, true),
            "[########------------]  42%  step 126/300  elapsed 1m05s  ETA 1m30s  loss 1.2345");
  EXPECT_EQ(progress_text({300, 0, 300, 90, ""}, true), "[####################] 100%  step 300/300  elapsed 1m30s  ETA 0s");
  EXPECT_EQ(progress_text({1, 0, 300, 2, "x"}, true), "[--------------------]   0%  step 1/300  elapsed 2s  ETA 9m58s  x");
  // resumed at step 200: 10 steps in 20 s, 90 left
  EXPECT_EQ(progress_text({210, 200, 300, 20, "x"}, false), "step   210/300   70%  elapsed 20s  ETA 3m00s  x");
}

TEST(CliDataDefaults, ARunOfOverAnHourIsWarnedAboutOnceItsSpeedIsMeasured) {
  using shardwise::cli::eta_warning;
  // 3 steps in 30 s: 4497 steps left take 12h29m30s.
  EXPECT_EQ(eta_warning({3, 4497, 30}),
            "warning: at 10 s a step the 4497 steps left take about 12h29m (over an hour): --steps, --epochs or "
            "--tokens sets a shorter run");
  EXPECT_EQ(eta_warning({3, 300, 30}), "");  // 50 minutes
  EXPECT_EQ(eta_warning({2, 4498, 20}), "");  // not yet measured: 2 steps in 20 s
  EXPECT_NE(eta_warning({1, 400, 40}), "");   // one slow step (40 s) is measure enough
}

}  // namespace
