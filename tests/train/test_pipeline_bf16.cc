// bf16 parameters (fp32 masters) through every pipeline schedule: the curves follow the single-rank
// bf16 curve, and the masters saved on one rank resume on pp=2 and the other way round, continuing
// an uninterrupted run.
//
// Tolerance 5e-4 relative, as test_topology's bf16 meshes: masters that differ in the last float
// bit (the pipeline sums micro-batch gradients and the tied embedding's two copies in another
// order) can round to neighbouring bf16 values, which moves the loss by about 1e-5..1e-4; a wrong
// gradient or a lost master shows at once (bf16 vs f32 alone is about 1e-3 after 10 steps).
#include <gtest/gtest.h>

#include <filesystem>

#include "shardwise/ckpt/commit.h"
#include "tests/support/pipeline_config.h"
#include "tests/support/sharding_runs.h"
#include "tests/support/train_losses.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

constexpr double kBf16Rtol = 5e-4;

TrainConfig bf16(const std::string& mesh, const std::string& schedule = "1f1b") {
  TrainConfig c = pipeline_test_config(mesh, schedule);
  c.optimizer.steps = 10;
  c.bf16 = true;
  return c;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& ref, size_t from, const std::string& what) {
  ASSERT_EQ(got.size() + from, ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], ref[from + i], kBf16Rtol * std::abs(ref[from + i])) << what << ": step " << from + i + 1;
}

const std::vector<double>& reference() {
  static const std::vector<double> ref = train_losses(bf16("dp=1"), 10, {}, {});
  return ref;
}

TEST(PipelineBf16, ReferenceRoundsToBf16) {
  TrainConfig f32 = bf16("dp=1");
  f32.bf16 = false;
  const std::vector<double> full = train_losses(f32, 10, {}, {});
  ASSERT_EQ(reference().size(), 10u);
  EXPECT_NE(reference().back(), full.back());  // the kernels really read bf16 weights
  EXPECT_LT(reference().back(), reference().front());
}

TEST(PipelineBf16, EveryScheduleOnPp2FollowsTheSingleRankBf16Curve) {
  for (const char* schedule : {"fthenb", "1f1b", "interleaved", "zbh1"}) {
    TrainConfig c = bf16("pp=2", schedule);
    c.check(2);
    expect_close(train_losses(c, 10, {}, {}), reference(), 0, std::string(schedule) + " bf16 on pp=2");
  }
}

TEST(PipelineBf16, Dp2xPp2AndShardingStagesFollowTheSingleRankBf16Curve) {
  expect_close(train_losses(bf16("pp=2,dp=2"), 10, {}, {}), reference(), 0, "1f1b bf16 on pp=2,dp=2");
  expect_close(train_losses(bf16("pp=2,dp=2", "zbh1"), 10, {}, {}), reference(), 0, "zbh1 bf16 on pp=2,dp=2");
  for (int stage : {1, 2, 3}) {
    TrainConfig c = bf16("pp=2,dp=2");
    c.parallel.sharding = {stage, "v2"};
    expect_close(train_losses(c, 10, {}, {}), reference(), 0, "bf16 on pp=2,dp=2 sharding stage " + std::to_string(stage));
  }
}

fs::path fresh(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-pp-bf16-" + name);
  fs::remove_all(d);
  return d;
}

// Saved after 5 steps on one mesh, resumed on the other: the fp32 masters and both moments come
// back bit for bit (not the bf16 weights widened), so the next 5 steps follow the uninterrupted run.
void expect_resumes(const std::string& save_mesh, const std::string& load_mesh) {
  const std::string what = "bf16 saved on " + save_mesh + ", resumed on " + load_mesh;
  fs::path root = fresh(save_mesh + "-to-" + load_mesh);
  const sharding_test::States saved = sharding_test::train(bf16(save_mesh), 5, {}, root, true).states;
  fs::path dir = ckpt::find_resume(root)->dir;
  ASSERT_TRUE(fs::exists(dir / "master_weights.safetensors.index.json")) << what;
  sharding_test::expect_same_states(sharding_test::train(bf16(load_mesh), 0, dir, {}, true).states, saved, what);
  expect_close(train_losses(bf16(load_mesh), 5, dir, {}), reference(), 5, what);
}

TEST(PipelineBf16, MastersSavedOnOneRankResumeOnPp2) { expect_resumes("dp=1", "pp=2"); }

TEST(PipelineBf16, MastersSavedOnPp2ResumeOnOneRank) { expect_resumes("pp=2", "dp=1"); }

}  // namespace
}  // namespace shardwise::train
