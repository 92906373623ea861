// `train --save-model-only` (alias --no-optimizer-state) and `--resume ... --skip-optimizer`: what
// such a checkpoint holds (against a full checkpoint of the same run), the refusal to resume it
// without --skip-optimizer, and the first step after --skip-optimizer against AdamW's update from
// fresh moments computed here: with zero moments and bias correction at t = 1 (and no weight decay)
// every weight moves by lr * g / (|g| + eps), at most lr and lr itself wherever |g| >> eps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "run_cli.h"
#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"

namespace {

namespace fs = std::filesystem;
using shardwise_cli_test::Result;
using shardwise_cli_test::run;
using shardwise_cli_test::TempDir;

constexpr double kLr = 1e-3;

// A tiny GPT-2 at a constant learning rate (no warm-up, min-lr = lr) without weight decay.
std::string train(const fs::path& run_dir, int steps, const std::string& extra) {
  return fmt::format("train --layers 1 --hidden 32 --global-batch 8 --eval-every 0 --lr {0} --min-lr {0} --warmup 0 "
                     "--weight-decay 0 --steps {1} --run-dir {2} {3}", kLr, steps, run_dir.string(), extra);
}

fs::path ckpt(const fs::path& run_dir, int step) { return run_dir / "checkpoints" / fmt::format("checkpoint-{}", step); }

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? e.file_size() : 0;
  return n;
}

bool has_file_starting(const fs::path& dir, const std::string& prefix) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(prefix)) return true;
  return false;
}

TEST(CliModelOnly, CheckpointsHoldTheModelAndNoOptimizerStateAndVerify) {
  TempDir full("sw_mo_full"), only("sw_mo_only"), alias("sw_mo_alias");
  Result r = run(train(full.path, 2, "--save-every 2"));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(train(only.path, 2, "--save-every 2 --save-model-only"));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(train(alias.path, 2, "--save-every 2 --no-optimizer-state"));
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path f = ckpt(full.path, 2), m = ckpt(only.path, 2);
  for (const char* name : {"config.json", "generation_config.json", "trainer_state.json", shardwise::ckpt::kManifestName})
    EXPECT_TRUE(fs::exists(m / name)) << name;
  EXPECT_TRUE(has_file_starting(m, "model"));
  EXPECT_TRUE(has_file_starting(f, "optimizer"));
  EXPECT_FALSE(has_file_starting(m, "optimizer"));
  EXPECT_FALSE(has_file_starting(ckpt(alias.path, 2), "optimizer"));
  EXPECT_FALSE(has_file_starting(m, "master_weights"));
  const nlohmann::json state = nlohmann::json::parse(shardwise::ckpt::read_text_file(m / "trainer_state.json"));
  EXPECT_FALSE(state.contains("rng"));
  EXPECT_EQ(state["optimizer"]["state_saved"], false);
  EXPECT_EQ(state["step"], 2);
  // The same run's weights, bit for bit; the full checkpoint adds two moments per weight (f32).
  shardwise::ckpt::GroupReader wf(f, "model"), wm(m, "model");
  ASSERT_EQ(wf.names(), wm.names());
  for (const std::string& n : wf.names()) {
    const auto& a = wf.file_of(n).data(wf.info(n));
    const auto& b = wm.file_of(n).data(wm.info(n));
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << n;
  }
  EXPECT_GE(dir_bytes(f), dir_bytes(m) + 2 * wm.total_size());
  EXPECT_LT(dir_bytes(m), 2 * wm.total_size());
  r = run("ckpt verify " + m.string());
  EXPECT_EQ(r.status, 0) << r.out;
}

// The weights of checkpoint `dir` (f32), by name.
std::map<std::string, std::vector<float>> weights(const fs::path& dir) {
  shardwise::ckpt::GroupReader g(dir, "model");
  std::map<std::string, std::vector<float>> out;
  for (const std::string& n : g.names()) {
    shardwise::Tensor t = g.file_of(n).read(n);
    if (t.dtype() == shardwise::DType::F32) out[n].assign(t.data<float>(), t.data<float>() + t.numel());
  }
  return out;
}

TEST(CliModelOnly, ResumeNeedsSkipOptimizerWhichStartsAdamWFreshAtTheSavedStep) {
  TempDir only("sw_mo_resume_only"), full("sw_mo_resume_full"), a("sw_mo_resume_a"), b("sw_mo_resume_b");
  ASSERT_EQ(run(train(only.path, 2, "--save-every 2 --save-model-only")).status, 0);
  ASSERT_EQ(run(train(full.path, 2, "--save-every 2")).status, 0);
  Result r = run(train(a.path, 3, "--save-every 1 --resume " + ckpt(only.path, 2).string()));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("holds no optimizer state (saved with --save-model-only): --resume it with --skip-optimizer"),
            std::string::npos) << r.out;
  r = run(train(b.path, 3, "--save-every 1 --skip-optimizer"));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--skip-optimizer applies to --resume"), std::string::npos) << r.out;
  r = run(train(b.path, 3, "--save-model-only"));  // saves nothing
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--save-model-only: this run saves no checkpoints"), std::string::npos) << r.out;
  TempDir a2("sw_mo_resume_a2"), b2("sw_mo_resume_b2");
  r = run(train(a2.path, 3, "--save-every 1 --skip-optimizer --resume " + ckpt(only.path, 2).string()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--skip-optimizer: AdamW starts fresh at step 2"), std::string::npos) << r.out;
  r = run(train(b2.path, 3, "--save-every 1 --skip-optimizer --resume " + ckpt(full.path, 2).string()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("the checkpoint's moments are not read"), std::string::npos) << r.out;
  const auto before = weights(ckpt(only.path, 2)), after = weights(ckpt(a2.path, 3));
  // A full checkpoint's moments are ignored: the same step, bit for bit.
  EXPECT_EQ(after, weights(ckpt(b2.path, 3)));
  ASSERT_FALSE(before.empty());
  double largest = 0;
  for (const auto& [name, w0] : before) {
    const std::vector<float>& w1 = after.at(name);
    for (size_t i = 0; i < w0.size(); ++i) {
      const double moved = std::abs(static_cast<double>(w1[i]) - w0[i]);
      // lr * |g| / (|g| + eps) <= lr, plus the rounding of w1 to f32
      ASSERT_LE(moved, kLr * (1 + 1e-6) + std::abs(w0[i]) * 1.2e-7) << name << "[" << i << "]";
      largest = std::max(largest, moved);
    }
  }
  // Bias correction from t = 1: the largest step is lr (t = 3 would give 0.62 lr at beta2 0.95).
  EXPECT_NEAR(largest, kLr, 1e-3 * kLr);
}

}  // namespace
