// Runs that do not collide and runs that can be stopped: a run without --run-dir gets a directory of
// its own (runs/<config or model>-<time>, runs/latest), --resume finds the run it continues, and
// SIGINT / SIGTERM stop a run after its step with a checkpoint, a summary and the command that
// continues it (a real signal to a real `shardwise train` child, threads and mpirun).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.h"
#include "run_cli.h"

namespace {

namespace fs = std::filesystem;

using shardwise_cli_test::Child;
using shardwise_cli_test::Result;
using shardwise_cli_test::run_command;

std::string bin() {
  const char* b = std::getenv("SHARDWISE_BIN");
  return b ? b : "shardwise";
}

// A scratch working directory per test: runs/ lands in it.
struct Cwd {
  fs::path path;
  explicit Cwd(const std::string& name) : path(fs::temp_directory_path() / ("sw_cli_runs_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Cwd() { fs::remove_all(path); }
  // `shardwise ARGS` run in this directory.
  Result run(const std::string& args) const { return run_command("cd " + path.string() + " && " + bin() + " " + args); }
};

const std::string kTiny = " --layers 1 --hidden 32 --global-batch 8 --eval-every 0 ";

// The "run directory: X" the run printed ("" when none).
std::string run_dir_of(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("run directory: (\\S+)")) ? m[1].str() : "";
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

// The "loss" field of each metrics.jsonl line, as written (bit for bit at %.17g).
std::vector<std::string> losses(const fs::path& jsonl) {
  std::vector<std::string> out;
  const std::regex loss("\"loss\":([^,}]+)");
  for (const std::string& line : lines_of(jsonl)) {
    std::smatch m;
    if (std::regex_search(line, m, loss)) out.push_back(m[1].str());
  }
  return out;
}

// Two runs started back to back, with the same options, get directories of their own under runs/
// (named by the model, or by the config file), each with its own metrics; runs/latest names the
// second.
TEST(CliRuns, TwoRunsStartedBackToBackGetDirectoriesOfTheirOwn) {
  Cwd d("back_to_back");
  Result a = d.run("train --steps 2" + kTiny), b = d.run("train --steps 2" + kTiny);
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  const std::string da = run_dir_of(a.out), db = run_dir_of(b.out);
  EXPECT_TRUE(std::regex_match(da, std::regex("runs/gpt2-[0-9]{8}-[0-9]{6}(-[0-9]+)?"))) << a.out;
  EXPECT_TRUE(std::regex_match(db, std::regex("runs/gpt2-[0-9]{8}-[0-9]{6}(-[0-9]+)?"))) << b.out;
  ASSERT_NE(da, db);
  EXPECT_EQ(lines_of(d.path / da / "metrics.jsonl").size(), 2u);
  EXPECT_EQ(lines_of(d.path / db / "metrics.jsonl").size(), 2u);
  EXPECT_EQ(fs::read_symlink(d.path / "runs/latest"), fs::path(db).filename());
  std::ofstream(d.path / "mini.toml") << "steps = 1\nlayers = 1\nhidden = 32\nglobal-batch = 8\n";
  Result c = d.run("train --config mini.toml");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(run_dir_of(c.out).rfind("runs/mini-", 0), 0u) << c.out;
}

// The sequence: the README's saving run (rotation, async), then the demo's settings, which
// save their last step: neither is refused because of the other.
TEST(CliRuns, TheReadmeSavingRunThenTheDemoBothPass) {
  Cwd d("readme_then_demo");
  Result saving = d.run("train --steps 4 --save-every 2 --async-save --save-total-limit 3" + kTiny);
  ASSERT_EQ(saving.status, 0) << saving.out;
  Result demo = d.run("train --config " SHARDWISE_SOURCE_DIR "/examples/demo.toml --steps 4");
  ASSERT_EQ(demo.status, 0) << demo.out;
  const std::string dir = run_dir_of(demo.out);
  EXPECT_EQ(dir.rfind("runs/demo-", 0), 0u) << demo.out;
  EXPECT_TRUE(fs::exists(d.path / dir / "checkpoints/checkpoint-4/manifest.json")) << demo.out;
  EXPECT_EQ(lines_of(d.path / run_dir_of(saving.out) / "metrics.jsonl").size(), 4u);
}

// `make demo`'s script at a small size: it trains into a run directory of its own, saves the last
// step and ends by answering sums from that checkpoint, each marked right or wrong against the sum.
TEST(CliRuns, TheDemoEndsByAnsweringSumsFromItsCheckpoint) {
  Cwd d("demo");
  Result r = run_command("cd " + d.path.string() + " && bash " SHARDWISE_SOURCE_DIR "/examples/demo.sh " + bin() +
                         " --steps 30 --progress none");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::regex answer("\\n  ([0-9]+)\\+([0-9]+)=(\\S*) +(right|wrong)");
  int answers = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), answer); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    const bool right = std::to_string(std::stoll(m[1].str()) + std::stoll(m[2].str())) == m[3].str();
    EXPECT_EQ(m[4].str(), right ? "right" : "wrong") << m[0].str();
    ++answers;
  }
  EXPECT_EQ(answers, 8) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("of 8 right\\. The run: (runs/demo-[0-9-]+) "))) << r.out;
  EXPECT_TRUE(fs::exists(d.path / m[1].str() / "checkpoints/checkpoint-30/manifest.json")) << r.out;
  EXPECT_EQ(fs::read_symlink(d.path / "runs/latest"), fs::path(m[1].str()).filename());
}

// --resume auto without --run-dir continues the newest run of that name that has a checkpoint, in
// its directory: one metrics.jsonl of all the steps.
TEST(CliRuns, ResumeAutoContinuesTheNewestRunWithACheckpoint) {
  Cwd d("resume_auto");
  Result first = d.run("train --steps 4 --save-every 2" + kTiny);
  ASSERT_EQ(first.status, 0) << first.out;
  Result later = d.run("train --steps 6 --save-every 2 --resume auto" + kTiny);
  ASSERT_EQ(later.status, 0) << later.out;
  const std::string dir = run_dir_of(first.out);
  EXPECT_EQ(run_dir_of(later.out), dir) << later.out;
  EXPECT_NE(later.out.find("resumed from " + dir + "/checkpoints/checkpoint-4"), std::string::npos) << later.out;
  EXPECT_EQ(lines_of(d.path / dir / "metrics.jsonl").size(), 6u);
}

// A fresh run in a run directory given again moves the earlier run's metrics and its loss curve
// aside together: no curve is left beside another run's metrics.
TEST(CliRuns, AFreshRunInAUsedRunDirMovesTheEarlierCurveAsideWithItsMetrics) {
  Cwd d("used_dir");
  ASSERT_EQ(d.run("train --steps 2 --run-dir r" + kTiny).status, 0);
  std::ifstream curve(d.path / "r/loss_curve.svg");
  const std::string first((std::istreambuf_iterator<char>(curve)), std::istreambuf_iterator<char>());
  Result again = d.run("train --steps 3 --run-dir r" + kTiny);
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_EQ(lines_of(d.path / "r/metrics.jsonl.previous").size(), 2u);
  std::ifstream aside(d.path / "r/loss_curve.svg.previous");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(aside)), std::istreambuf_iterator<char>()), first);
}

// --resume of a checkpoint that rotation removed says so and lists the ones that exist.
TEST(CliRuns, ResumeOfARemovedCheckpointNamesTheOnesThatExist) {
  Cwd d("removed");
  ASSERT_EQ(d.run("train --steps 6 --save-every 2 --save-total-limit 1 --run-dir r" + kTiny).status, 0);
  Result r = d.run("train --steps 8 --save-every 2 --run-dir r --resume r/checkpoints/checkpoint-2" + kTiny);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--resume r/checkpoints/checkpoint-2: there is no such checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("holds checkpoint-6: pass one of them, or --resume auto"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--no-verify-resume"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

// The resume command the summary printed ("" when none).
std::string resume_line(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("resume with: ([^\n]+)")) ? m[1].str() : "";
}

// Ctrl-C (SIGINT) to a run of 2 ranks (threads): both stop after the same step, which is saved
// (--save-on-interrupt is on with --save-every); the summary names the checkpoint and the command
// that continues the run, the curve is drawn, the exit status is 130. That command finishes the
// run with the same losses, bit for bit, as a run that was never stopped.
TEST(CliRuns, CtrlCStopsAfterTheStepSavesAndTheResumeCommandFinishesTheSameRun) {
  Cwd d("ctrl_c");
  const std::string args = "train --mesh dp=2 --steps 400 --save-every 1000 --progress lines --log-every 1" + kTiny;
  Child child("cd " + d.path.string() + " && exec " + bin() + " " + args + " --run-dir stopped");
  ASSERT_TRUE(child.wait_for("step     1/400")) << child.out();
  child.signal(SIGINT);
  const int status = child.finish();
  const std::string& out = child.out();
  ASSERT_EQ(status, 130) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("interrupted \\(SIGINT\\): ([0-9]+) of 400 steps"))) << out;
  const int stopped = std::stoi(m[1].str());
  ASSERT_LT(stopped, 400);
  const std::string ckpt = "stopped/checkpoints/checkpoint-" + std::to_string(stopped);
  EXPECT_NE(out.find("newest checkpoint: " + ckpt + " (step " + std::to_string(stopped) + ")"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(d.path / ckpt / "manifest.json")) << out;
  EXPECT_TRUE(fs::exists(d.path / "stopped/loss_curve.svg")) << out;
  EXPECT_EQ(losses(d.path / "stopped/metrics.jsonl").size(), static_cast<size_t>(stopped));
  const std::string resume = resume_line(out);
  ASSERT_NE(resume.find("--run-dir stopped --resume auto"), std::string::npos) << out;
  Result resumed = run_command("cd " + d.path.string() + " && " + resume);
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  ASSERT_EQ(d.run(args + " --run-dir whole").status, 0);
  const std::vector<std::string> whole = losses(d.path / "whole/metrics.jsonl");
  ASSERT_EQ(whole.size(), 400u);
  EXPECT_EQ(losses(d.path / "stopped/metrics.jsonl"), whole);
}

// SIGTERM (what a scheduler sends) stops a run that does not save: no checkpoint, and the summary
// says how to keep one; --no-save-on-interrupt with --save-every saves nothing more either.
TEST(CliRuns, SigtermStopsARunThatDoesNotSaveAndSaysSo) {
  Cwd d("sigterm");
  Child child("cd " + d.path.string() + " && exec " + bin() + " train --steps 400 --progress lines --log-every 1" +
              kTiny + " --run-dir r --save-every 1000 --no-save-on-interrupt");
  ASSERT_TRUE(child.wait_for("step     1/400")) << child.out();
  child.signal(SIGTERM);
  ASSERT_EQ(child.finish(), 130) << child.out();
  EXPECT_NE(child.out().find("interrupted (SIGTERM)"), std::string::npos) << child.out();
  EXPECT_NE(child.out().find("no checkpoint to resume from"), std::string::npos) << child.out();
  EXPECT_FALSE(fs::exists(d.path / "r/checkpoints") && !fs::is_empty(d.path / "r/checkpoints"));
}

// A second Ctrl-C stops at once: status 130, no summary. The second is sent when the first has been
// taken (its message is out: two signals pending at once would be one), and the steps are long
// enough (a larger model, about a second each) that it lands within the step the first one ends.
TEST(CliRuns, ASecondCtrlCStopsAtOnce) {
  Cwd d("twice");
  Child child("cd " + d.path.string() + " && exec " + bin() +
              " train --steps 400 --progress lines --log-every 1 --layers 2 --hidden 256 --seq 128 --global-batch 64 "
              "--data " SHARDWISE_SOURCE_DIR "/tests/data/fables.txt --vocab 256 --eval-every 0 --run-dir r");
  ASSERT_TRUE(child.wait_for("step     1/400")) << child.out();
  child.signal(SIGINT);
  ASSERT_TRUE(child.wait_for("stopping after this step")) << child.out();
  child.signal(SIGINT);
  ASSERT_EQ(child.finish(), 130) << child.out();
  EXPECT_NE(child.out().find("second signal: stopping now"), std::string::npos) << child.out();
  EXPECT_EQ(child.out().find("interrupted ("), std::string::npos) << child.out();
}

#ifdef SHARDWISE_MPIRUN_LINE
// Ctrl-C on a terminal signals the whole job. mpirun takes the SIGINT, sends each process SIGTERM
// odls_base_sigkill_timeout seconds later, then SIGKILL as long again after it (1 s by default; the
// job here gives 3), and reads none of their output while it waits (so the run prints a line every 10
// steps only). The 2 processes stop after the same step, save it and print the summary once; the
// exit status is mpirun's (not 0).
TEST(CliRuns, CtrlCToAnMpirunJobStopsEveryRankAfterTheSameStep) {
  Cwd d("mpirun");
  Child child("cd " + d.path.string() + " && exec " + std::string(SHARDWISE_MPIRUN_LINE) +
              " --mca odls_base_sigkill_timeout 3 -np 2 " + bin() +
              " train --mesh dp=2 --steps 4000 --save-every 10000 --progress lines --log-every 10 --layers 2 "
              "--hidden 128 --global-batch 32 --eval-every 0 --run-dir r");
  ASSERT_TRUE(child.wait_for("step    10/4000")) << child.out();
  child.signal_group(SIGINT);
  const int status = child.finish();
  const std::string& out = child.out();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("interrupted \\(SIG(INT|TERM)\\): ([0-9]+) of 4000 steps"))) << out;
  const std::string ckpt = "r/checkpoints/checkpoint-" + m[2].str();
  EXPECT_TRUE(fs::exists(d.path / ckpt / "manifest.json")) << out;
  EXPECT_NE(resume_line(out).find("mpirun"), std::string::npos) << out;
  EXPECT_EQ(out.find("interrupted ("), out.rfind("interrupted (")) << "one summary: " << out;
  EXPECT_NE(status, 0) << out;
}
#endif

// What the README says of meshes (point 8 of issue 29): the same first steps to rounding, and a
// drift that compounds over hundreds of steps, real (the curves are not the same bits) and small.
// The demo's settings over 225 steps: measured 1.4957 (dp=4) against 1.4991 (dp=2 x tp=2) at the
// last step, 0.2% apart (2026-11-28).
TEST(CliRuns, MeshesAgreeToRoundingAndDriftApartOverHundredsOfSteps) {
  Cwd d("drift");
  std::vector<std::vector<double>> curves;
  for (const char* mesh : {"dp=4", "dp=2,tp=2"}) {
    const std::string dir = (d.path / mesh).string();
    Result r = d.run("train --config " SHARDWISE_SOURCE_DIR "/examples/demo.toml --mesh " + std::string(mesh) +
                   " --steps 225 --save-every 0 --eval-every 0 --progress none --run-dir '" + dir + "'");
    ASSERT_EQ(r.status, 0) << r.out;
    std::vector<double> losses;
    for (const std::string& l : shardwise_cli_test::metrics_losses(fs::path(dir) / "metrics.jsonl"))
      losses.push_back(std::stod(l));
    ASSERT_EQ(losses.size(), 225u) << r.out;
    curves.push_back(losses);
  }
  auto rel = [&](size_t step) { return std::abs(curves[0][step] - curves[1][step]) / curves[1][step]; };
  EXPECT_EQ(curves[0][0], curves[1][0]);  // the same weights and batch: the first loss agrees to the bit here
  for (size_t s = 0; s < 20; ++s) EXPECT_LE(rel(s), 1e-5) << "step " << s + 1;
  EXPECT_NE(curves[0][224], curves[1][224]) << "the curves are the same bits: the README says they drift";
  EXPECT_LE(rel(224), 0.02) << curves[0][224] << " vs " << curves[1][224];
}

}  // namespace

