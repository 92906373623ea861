// `shardwise train --data ... --val-fraction F | --val-data FILE`: validation loss and perplexity
// in metrics.jsonl at the evaluation steps, on the progress line, in loss_curve.svg (and its log
// axis), through --config and across a resume; the errors name the option.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::lines;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sw_cli_val_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Headerless uint16 tokens (.bin: auto-detected), `n` of them below `vocab`.
fs::path write_tokens(const fs::path& p, uint32_t n, uint32_t vocab) {
  std::ofstream out(p, std::ios::binary);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t t = (i * 37 + i / 7) % vocab;
    out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
  }
  return p;
}

std::string train(int steps, const fs::path& run_dir, int layers = 1) {
  return "train --layers " + std::to_string(layers) + " --hidden 32 --global-batch 4 --seq 16 --vocab 300 --lr 0.01 --warmup 1 --steps " +
         std::to_string(steps) + " --run-dir " + run_dir.string() + " ";
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The number after "key": in a JSON line; NAN when absent.
double field(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  return at == std::string::npos ? NAN : std::stod(line.substr(at + key.size() + 3));
}

struct Line {
  double loss, val_loss, val_ppl;
};
std::map<int, Line> metrics(const fs::path& run_dir) {
  std::map<int, Line> out;
  std::ifstream f(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);)
    out[static_cast<int>(field(line, "step"))] = {field(line, "loss"), field(line, "val_loss"), field(line, "val_ppl")};
  return out;
}

// The points of the <polyline id="..."> (x,y pairs).
int polyline_points(const std::string& svg, const std::string& id) {
  const size_t at = svg.find("<polyline id=\"" + id + "\"");
  if (at == std::string::npos) return 0;
  const size_t from = svg.find("points=\"", at) + 8;
  const std::string pts = svg.substr(from, svg.find('"', from) - from);
  return static_cast<int>(std::count(pts.begin(), pts.end(), ','));
}

TEST(CliValidation, EvaluationStepsCarryValLossAndPerplexity) {
  fs::path d = fresh_dir("steps");
  const fs::path data = write_tokens(d / "corpus.bin", 4000, 300);
  Result r = run(train(5, d / "run") + "--eval-every 2 --data " + data.string() +
                 " --val-fraction 0.2 --val-samples 4 --loss-axis log");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("validation: 4 sequences of 17 tokens spread evenly over " + data.string()), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("validation part: tokens [3200, 4000) of 4000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  val "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", validation loss "), std::string::npos) << r.out;
  std::map<int, Line> m = metrics(d / "run");
  ASSERT_EQ(m.size(), 5u);
  for (const auto& [step, line] : m) {
    const bool evaluated = step == 2 || step == 4 || step == 5;  // every 2 steps and at the end
    EXPECT_EQ(!std::isnan(line.val_loss), evaluated) << "step " << step;
    EXPECT_EQ(!std::isnan(line.val_ppl), evaluated) << "step " << step;
    if (evaluated) {
      EXPECT_GT(line.val_loss, 0) << step;
      EXPECT_NEAR(line.val_ppl, std::exp(line.val_loss), 1e-9 * line.val_ppl) << step;
    }
  }
  const std::string svg = read(d / "run" / "loss_curve.svg");
  EXPECT_EQ(polyline_points(svg, "train-loss"), 5);
  EXPECT_EQ(polyline_points(svg, "val-loss"), 3);
  EXPECT_NE(svg.find("validation loss</text>"), std::string::npos);
  EXPECT_NE(svg.find("training loss</text>"), std::string::npos);
  EXPECT_NE(svg.find("loss (log scale)"), std::string::npos);
  // The linear axis on request, and a run without validation draws no validation series.
  Result plain = run(train(2, d / "plain") + "--eval-every 1 --loss-axis linear --data " + data.string());
  ASSERT_EQ(plain.status, 0) << plain.out;
  const std::string plain_svg = read(d / "plain" / "loss_curve.svg");
  EXPECT_EQ(plain_svg.find("log scale"), std::string::npos);
  EXPECT_EQ(polyline_points(plain_svg, "val-loss"), 0);
  EXPECT_EQ(read(d / "plain" / "metrics.jsonl").find("val_loss"), std::string::npos);
  fs::remove_all(d);
}

TEST(CliValidation, AResumedRunKeepsItsEarlierValidationPointsAndItsCurve) {
  fs::path d = fresh_dir("resume");
  const std::string data = " --eval-every 1 --val-fraction 0.25 --data " + write_tokens(d / "c.bin", 4000, 300).string();
  ASSERT_EQ(run(train(4, d / "whole") + data).status, 0);
  ASSERT_EQ(run(train(2, d / "parts") + data + " --save-every 2").status, 0);
  Result r = run(train(4, d / "parts") + data + " --save-every 2 --resume auto");
  ASSERT_EQ(r.status, 0) << r.out;
  std::map<int, Line> whole = metrics(d / "whole"), parts = metrics(d / "parts");
  ASSERT_EQ(parts.size(), 4u);
  for (int step = 1; step <= 4; ++step) {
    // The resumed run reads the same training samples (consumed samples of the training part) and
    // evaluates the same validation sequences.
    EXPECT_NEAR(parts[step].loss, whole[step].loss, 1e-6 * whole[step].loss) << step;
    EXPECT_NEAR(parts[step].val_loss, whole[step].val_loss, 1e-6 * whole[step].val_loss) << step;
  }
  EXPECT_EQ(polyline_points(read(d / "parts" / "loss_curve.svg"), "val-loss"), 4);
  // Another fraction would train on other windows: the resume is refused, naming both.
  Result other = run(train(6, d / "parts") + " --eval-every 1 --val-fraction 0.5 --data " + (d / "c.bin").string() +
                     " --save-every 2 --resume auto");
  EXPECT_NE(other.status, 0);
  EXPECT_NE(other.out.find("less its last 0.25 held out (--val-fraction), this run reads"), std::string::npos)
      << other.out;
  fs::remove_all(d);
}

TEST(CliValidation, ConfigFileKeysAndASeparateValidationFile) {
  fs::path d = fresh_dir("config");
  const fs::path data = write_tokens(d / "train.bin", 3000, 300), val = write_tokens(d / "val.bin", 600, 200);
  {
    std::ofstream(d / "run.toml") << "[train]\nval-data = \"" << val.string()
                                  << "\"\nval-samples = 3\nloss-axis = \"log\"\neval-every = 1\n";
  }
  Result r = run(train(2, d / "run") + "--config " + (d / "run.toml").string() + " --data " + data.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("validation: 3 sequences of 17 tokens spread evenly over " + val.string()), std::string::npos)
      << r.out;
  std::map<int, Line> m = metrics(d / "run");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_FALSE(std::isnan(m[1].val_loss));
  EXPECT_NE(read(d / "run" / "loss_curve.svg").find("loss (log scale)"), std::string::npos);
  std::ofstream(d / "bad.toml") << "val-fraction = \"half\"\n";
  Result bad = run(train(2, d / "bad") + "--config " + (d / "bad.toml").string() + " --data " + data.string());
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("key 'val-fraction' expects a number"), std::string::npos) << bad.out;
  fs::remove_all(d);
}

// Under mpirun (2 processes, a pipeline): the validation losses of the single-rank run.
TEST(CliValidation, UnderMpirunOnAPipelineTheValidationLossIsTheSingleRankOne) {
  fs::path d = fresh_dir("mpi");
  const std::string data = " --eval-every 2 --val-fraction 0.2 --val-samples 5 --data " +
                           write_tokens(d / "c.bin", 4000, 300).string();
  ASSERT_EQ(run(train(4, d / "ref", 2) + data + " --mesh dp=1").status, 0);
  const char* bin = std::getenv("SHARDWISE_BIN");
  ASSERT_NE(bin, nullptr);
  Result r = shardwise_cli_test::run_command(std::string(SHARDWISE_MPIRUN_LINE) + " -np 2 " + bin + " " +
                                             train(4, d / "mpi", 2) + data + " --mesh pp=2 --accumulation 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(2 ranks, mpi)"), std::string::npos) << r.out;
  std::map<int, Line> ref = metrics(d / "ref"), got = metrics(d / "mpi");
  ASSERT_EQ(got.size(), 4u);
  for (int step : {2, 4}) {
    ASSERT_FALSE(std::isnan(ref[step].val_loss)) << step;
    EXPECT_NEAR(got[step].val_loss, ref[step].val_loss, 1e-5) << "step " << step;
  }
  fs::remove_all(d);
}

TEST(CliValidation, BadValidationOptionsAreOneLineNamingTheOption) {
  fs::path d = fresh_dir("errors");
  const std::string data = write_tokens(d / "train.bin", 2000, 300).string();
  const std::string wide = write_tokens(d / "wide.bin", 2000, 500).string();
  const std::string run_dir = (d / "run").string();
  struct Bad {
    std::string args, message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"--data " + data + " --val-data " + data + " --val-fraction 0.1",
            "--val-data '" + data + "' and --val-fraction 0.1 both name a validation set: give one of them"},
           {"--val-fraction 0.1", "--val-fraction needs --data: the embedded addition task has its own held-out problems"},
           {"--val-data " + data, "--val-data needs --data"},
           {"--data " + data + " --val-fraction 1.5", "--val-fraction must be in (0, 1)"},
           {"--data " + data + " --val-fraction -0.2", "--val-fraction must be in (0, 1)"},
           {"--data " + data + " --val-fraction 0.005", "--val-fraction 0.005 leaves the validation part of"},
           {"--data " + data + " --val-fraction 0.995", "--val-fraction 0.995 leaves the training part of"},
           {"--data " + data + " --val-data " + wide, "--val-data " + wide},
           {"--data " + data + " --val-data " + wide, "needs a vocabulary of 498 tokens, the model has 300 (--vocab)"},
           {"--data " + data + " --val-data " + (d / "none.bin").string(), "--val-data: cannot read the data file"},
           {"--data " + data + " --val-fraction 0.1 --val-samples 0", "--val-samples must be at least 1, got 0"},
           {"--data " + data + " --loss-axis cubic", "--loss-axis"},
       }) {
    Result r = run(train(2, d / "run") + b.args);
    EXPECT_EQ(r.status, 2) << b.args << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1) << b.args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("shardwise: error: ", 0), 0u) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find(b.message), std::string::npos) << b.args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(d / "run" / "metrics.jsonl"));  // refused before anything started
  fs::remove_all(d);
}

}  // namespace
