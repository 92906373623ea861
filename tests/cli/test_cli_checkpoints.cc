// The shardwise command when checkpoints go wrong: a corrupted or edited checkpoint, a save
// directory that cannot be written, a re-run into a run directory that holds checkpoints, and the
// bookkeeping of a resumed run (metrics.jsonl, loss curve, data fingerprint).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace {

namespace fs = std::filesystem;

using shardwise_cli_test::Result;
using shardwise_cli_test::run;

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

// A fresh run directory per test, removed afterwards.
struct RunDir {
  fs::path path;
  explicit RunDir(const std::string& name) : path(fs::temp_directory_path() / ("sw_cli_ckpt_" + name)) {
    fs::remove_all(path);
  }
  ~RunDir() { fs::remove_all(path); }
  fs::path ckpt(int step) const { return path / "checkpoints" / ("checkpoint-" + std::to_string(step)); }
};

// A tiny model: each run takes well under a second.
std::string train(const RunDir& d, int steps, const std::string& extra = "") {
  return "train --layers 1 --hidden 32 --global-batch 8 --eval-every 0 --save-every 3 --steps " + std::to_string(steps) +
         " --run-dir " + d.path.string() + " " + extra;
}

void flip_byte(const fs::path& p, size_t at) {
  std::string bytes = read(p);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  write(p, bytes);
}

// Trains 3 steps, changes checkpoint-3's `file` with `change`, resumes from it explicitly.
template <class Change>
Result resume_changed(const RunDir& d, const std::string& file, Change change, const std::string& extra = "") {
  if (run(train(d, 3)).status != 0) return {};
  change(d.ckpt(3) / file);
  return run(train(d, 6, "--resume " + d.ckpt(3).string() + extra));
}

// The run's summary says how many saves there were (every 3 steps of 7, and the last: steps 3, 6
// and 7) and how long they stopped training, in total and the longest.
TEST(CliCheckpoints, TheSummaryCountsTheSavesAndTheTimeTheyTook) {
  RunDir d("stalls");
  Result r = run(train(d, 7));
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.find("(newest: step 7); 3 saves stopped training for ");
  ASSERT_NE(at, std::string::npos) << r.out;
  double total = -1, longest = -1;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "(newest: step 7); 3 saves stopped training for %lf s, the longest %lf s", &total,
                        &longest), 2) << r.out;
  // The summary rounds each figure to 0.01 s (0.005 either way): total <= 3 x longest holds for
  // the printed figures within 4 x 0.005.
  EXPECT_GE(longest, 0.0);
  EXPECT_GE(total, longest);
  EXPECT_LE(total, 3 * longest + 0.02 + 1e-9);
  r = run(train(d, 8, "--resume auto --async-save"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(newest: step 8); 1 save stopped training for "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(async: the copies into host memory)"), std::string::npos) << r.out;
}

// A newest checkpoint written by a newer shardwise (its manifest's version above what this one
// reads) stops --resume auto with its name, instead of being set aside as corrupted and an older
// one resumed: nothing is moved.
TEST(CliCheckpoints, ResumeAutoStopsAtACheckpointOfANewerVersionAndMovesNothing) {
  RunDir d("newer");
  ASSERT_EQ(run(train(d, 6)).status, 0);
  const fs::path manifest = d.ckpt(6) / "manifest.json";
  std::string text = read(manifest);
  const size_t at = text.find("\"version\": ");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 12, "\"version\": 9");
  write(manifest, text);
  Result r = run(train(d, 9, "--resume auto"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint-6 was written by a newer shardwise (manifest.json: version 9 is newer than this "
                       "shardwise reads (2)): nothing was set aside"),
            std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d.ckpt(6))) << r.out;
  EXPECT_TRUE(fs::exists(d.ckpt(3))) << r.out;
  EXPECT_FALSE(fs::exists(d.ckpt(6).string() + ".rejected")) << r.out;
}

TEST(CliCheckpoints, ExplicitResumeRefusesAFlippedShardByteUnlessToldNotToVerify) {
  RunDir d("flip");
  Result r = resume_changed(d, "model-00001-of-00001.safetensors", [](const fs::path& shard) {
    flip_byte(shard, fs::file_size(shard) - 5);
  });
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint '" + d.ckpt(3).string() + "' does not verify: model-00001-of-00001.safetensors: xxh64"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--no-verify-resume"), std::string::npos) << r.out;
  r = run(train(d, 6, "--resume " + d.ckpt(3).string() + " --no-verify-resume"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("loaded without verification"), std::string::npos) << r.out;
}

TEST(CliCheckpoints, ExplicitResumeRefusesAnEditedTrainerState) {
  RunDir d("edited");
  Result r = resume_changed(d, "trainer_state.json", [](const fs::path& state) {
    std::string text = read(state);
    size_t at = text.find("\"consumed_samples\": 24");
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, 22, "\"consumed_samples\": 0 ");
    write(state, text);
  });
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("trainer_state.json: xxh64"), std::string::npos) << r.out;
}

TEST(CliCheckpoints, WhenEveryCheckpointIsRejectedTheFreshRunKeepsTheEarlierMetricsAside) {
  RunDir d("allbad");
  ASSERT_EQ(run(train(d, 3)).status, 0);
  const std::string earlier = read(d.path / "metrics.jsonl");
  ASSERT_FALSE(earlier.empty());
  fs::path shard = d.ckpt(3) / "model-00001-of-00001.safetensors";
  flip_byte(shard, fs::file_size(shard) - 5);
  Result r = run(train(d, 3, "--resume auto"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rejected checkpoint-3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("an earlier run's metrics were moved to"), std::string::npos) << r.out;
  EXPECT_EQ(read(d.path / "metrics.jsonl.previous"), earlier);
}

TEST(CliCheckpoints, ResumeAutoNamesTheRejectedCheckpointSetsItAsideAndPassesItsStep) {
  RunDir d("auto");
  ASSERT_EQ(run(train(d, 6)).status, 0);
  fs::path shard = d.ckpt(6) / "optimizer-00001-of-00001.safetensors";
  flip_byte(shard, fs::file_size(shard) - 5);
  write(d.ckpt(3) / "README.md", "notes of the user\n");  // harmless: reported, not fatal
  Result r = run(train(d, 9, "--resume auto"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rejected checkpoint-6: optimizer-00001-of-00001.safetensors: xxh64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("moved to checkpoint-6.rejected"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint-3: README.md: present but not listed in the manifest"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + d.ckpt(3).string() + " at step 3"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d.path / "checkpoints" / "checkpoint-6.rejected"));
  EXPECT_TRUE(fs::exists(d.ckpt(6) / "manifest.json"));  // saved again, past the rejected step
  EXPECT_TRUE(fs::exists(d.ckpt(9) / "manifest.json"));
}

TEST(CliCheckpoints, ResumingAnOlderCheckpointIntoASaveDirWithNewerOnesFailsBeforeTheFirstStep) {
  RunDir d("older");
  ASSERT_EQ(run(train(d, 6)).status, 0);
  Result r = run(train(d, 9, "--resume " + d.ckpt(3).string()));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("save directory '" + (d.path / "checkpoints").string() +
                       "' holds checkpoint-6, newer than the resumed step 3: this run would meet it when saving"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" loss "), std::string::npos) << r.out;  // no step ran
  EXPECT_TRUE(fs::exists(d.ckpt(6) / "manifest.json"));
}

TEST(CliCheckpoints, ASaveDirUnderAFileOrThatIsAFileFailsBeforeTheFirstStep) {
  RunDir d("notdir");
  fs::create_directories(d.path);
  write(d.path / "file", "x");
  Result r = run(train(d, 3, "--save-dir " + (d.path / "file").string()));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("save directory '" + (d.path / "file").string() + "' is not usable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("choose another --save-dir"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;  // no training happened
  // Tests run as root, where a chmod 0555 directory still takes files: a directory whose parent is a
  // regular file cannot be created, the same probe failure.
  r = run(train(d, 3, "--save-dir " + (d.path / "file" / "ckpts").string()));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("shardwise: error: rank 0 failed: save directory '" + (d.path / "file" / "ckpts").string() +
                       "' is not usable: cannot create it"),
            std::string::npos) << r.out;
  // One rank named, once: the rank that found the problem (every rank probes and agrees).
  EXPECT_EQ(r.out.find("rank ", r.out.find("rank 0 failed") + 1), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
}

// Needs root and tmpfs mounts (skipped otherwise).
TEST(CliCheckpoints, AReadOnlyOrFullFileSystemFailsBeforeTheFirstStep) {
  RunDir d("rofs");
  fs::create_directories(d.path / "ro");
  fs::create_directories(d.path / "small");
  std::string ro = (d.path / "ro").string(), small = (d.path / "small").string();
  if (std::system(("mount -t tmpfs -o ro,size=1m tmpfs " + ro + " 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  std::system(("mount -t tmpfs -o size=8k tmpfs " + small + " 2>/dev/null").c_str());
  Result r1 = run(train(d, 3, "--save-dir " + ro));
  Result r2 = run(train(d, 3, "--save-dir " + small));
  std::system(("umount " + ro + " " + small).c_str());
  EXPECT_NE(r1.status, 0) << r1.out;
  EXPECT_NE(r1.out.find("save directory '" + ro + "' is not usable: cannot write a file in it: Read-only file system"),
            std::string::npos) << r1.out;
  EXPECT_NE(r2.status, 0) << r2.out;
  EXPECT_NE(r2.out.find("save directory '" + small + "' has "), std::string::npos) << r2.out;
  EXPECT_NE(r2.out.find("free but one checkpoint needs about"), std::string::npos) << r2.out;
  EXPECT_EQ(r2.out.find("step "), std::string::npos) << r2.out;
}

TEST(CliCheckpoints, ARunDirWithCheckpointsIsOnlyReusedByAResumeAndKeepsItsMetrics) {
  RunDir d("rerun");
  ASSERT_EQ(run(train(d, 3)).status, 0);
  std::string metrics = read(d.path / "metrics.jsonl");
  Result r = run(train(d, 3));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("save directory '" + (d.path / "checkpoints").string() +
                       "' already holds 1 checkpoint (newest: checkpoint-3): pass --resume auto"),
            std::string::npos) << r.out;
  EXPECT_EQ(read(d.path / "metrics.jsonl"), metrics);
  EXPECT_TRUE(fs::exists(d.ckpt(3) / "manifest.json"));
}

std::vector<int> logged_steps(const fs::path& metrics) {
  std::vector<int> steps;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) steps.push_back(std::stoi(line.substr(line.find("\"step\":") + 7)));
  return steps;
}

TEST(CliCheckpoints, AResumedRunKeepsOneMetricsLinePerStepAndDrawsTheWholeCurve) {
  RunDir d("metrics");
  ASSERT_EQ(run(train(d, 6)).status, 0);
  // Killed after step 6 was logged but before checkpoint-6 was committed.
  fs::remove_all(d.ckpt(6));
  Result r = run(train(d, 9, "--resume auto"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(logged_steps(d.path / "metrics.jsonl"), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  std::string svg = read(d.path / "loss_curve.svg");
  size_t from = svg.find("<polyline"), points = svg.find("points=\"", from) + 8;
  std::string pts = svg.substr(points, svg.find('"', points) - points);
  EXPECT_EQ(std::count(pts.begin(), pts.end(), ','), 9) << pts;
}

TEST(CliCheckpoints, ResumingAtOrPastTheLastStepSaysSo) {
  RunDir d("steps");
  ASSERT_EQ(run(train(d, 6)).status, 0);
  Result r = run(train(d, 6, "--resume auto"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("nothing to do: " + d.ckpt(6).string() + " is at step 6, which --steps 6 asks for"),
            std::string::npos) << r.out;
  EXPECT_EQ(logged_steps(d.path / "metrics.jsonl").size(), 6u);
  r = run(train(d, 4, "--resume auto"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--steps 4 is below step 6 of the resumed checkpoint " + d.ckpt(6).string()), std::string::npos)
      << r.out;
}

TEST(CliCheckpoints, ResumingOnOtherDataIsRefused) {
  RunDir d("data");
  fs::create_directories(d.path);
  std::string a, b;
  for (int i = 0; i < 5000; ++i) a += static_cast<char>('a' + (i * 7) % 13), b += static_cast<char>('a' + (i * 5) % 13);
  write(d.path / "a.txt", a);
  write(d.path / "b.txt", b);
  ASSERT_EQ(run(train(d, 3, "--seq 32 --data " + (d.path / "a.txt").string())).status, 0);
  Result r = run(train(d, 6, "--seq 32 --resume auto --data " + (d.path / "b.txt").string()));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint " + d.ckpt(3).string() + " was trained on '" + (d.path / "a.txt").string()),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resume with the same --data"), std::string::npos) << r.out;
  // The embedded task: other digits at the same sequence length.
  RunDir e("digits");
  ASSERT_EQ(run(train(e, 3, "--seq 24 --digits 3")).status, 0);
  r = run(train(e, 6, "--seq 24 --digits 2 --resume auto"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("was trained on the 3-digit addition task at seq 24, this run reads the 2-digit addition task"),
            std::string::npos) << r.out;
}

}  // namespace
