// 20 training steps through every pipeline schedule follow the single-rank loss curve on pp=2,
// pp=4, pp=2 x dp=2 and pp=2 x tp=2 (and pp=2 x tp=2 with sequence parallelism): the stages,
// the micro-batch order, the tied embedding's two copies and the gradient norm change nothing
// but the order of floating-point sums. The held-out accuracy after training is the same too.
#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "tests/support/pipeline_config.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

TrainConfig small(const std::string& mesh, const std::string& schedule = "1f1b", int layers = 4) {
  return pipeline_test_config(mesh, schedule, layers);
}

struct Curve {
  std::vector<double> losses, norms;
  int64_t exact = -1;
};

Curve train(TrainConfig c) {
  c.check(mesh::parse_mesh(c.parallel.mesh).size());
  Curve out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& world) {
    Trainer t(c, world.group(world.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      StepResult r = t.step();
      if (world.rank() == 0) out.losses.push_back(r.loss), out.norms.push_back(r.grad_norm);
    }
    EvalResult e = t.evaluate();
    if (world.rank() == 0) out.exact = e.exact;
  });
  return out;
}

void expect_same_curve(const Curve& got, const Curve& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << ": step " << i + 1;
    EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-5 * std::abs(ref.norms[i])) << what << ": gradient norm, step " << i + 1;
  }
  EXPECT_EQ(got.exact, ref.exact) << what << ": held-out exact matches";
}

const Curve& reference(int layers) {
  static std::map<int, Curve> refs;
  if (!refs.contains(layers)) refs[layers] = train(small("dp=1", "1f1b", layers));
  return refs[layers];
}

void every_schedule_on(const std::string& mesh) {
  for (const char* schedule : {"fthenb", "1f1b", "interleaved", "zbh1"}) {
    expect_same_curve(train(small(mesh, schedule)), reference(4), std::string(schedule) + " on " + mesh);
  }
}

TEST(PipelineTopology, ReferenceLearns) {
  const Curve& ref = reference(4);
  ASSERT_EQ(ref.losses.size(), 20u);
  EXPECT_LT(ref.losses.back(), ref.losses.front() * 0.8) << "the loss should fall";
}

TEST(PipelineTopology, EveryScheduleOnPp2) { every_schedule_on("pp=2"); }

TEST(PipelineTopology, EveryScheduleOnPp4) {
  for (const char* schedule : {"fthenb", "1f1b", "zbh1"}) {
    expect_same_curve(train(small("pp=4", schedule)), reference(4), std::string(schedule) + " on pp=4");
  }
  // Interleaving 2 virtual stages on 4 ranks needs 8 layers (one per stage).
  expect_same_curve(train(small("pp=4", "interleaved", 8)), reference(8), "interleaved on pp=4");
}

TEST(PipelineTopology, EveryScheduleOnPp2xDp2) { every_schedule_on("pp=2,dp=2"); }

TEST(PipelineTopology, EveryScheduleOnPp2xTp2) { every_schedule_on("pp=2,tp=2"); }

TEST(PipelineTopology, SequenceParallelAndOneRankWithTwoStages) {
  TrainConfig sp = small("pp=2,tp=2");
  sp.parallel.sequence_parallel = true;
  expect_same_curve(train(sp), reference(4), "1f1b on pp=2,tp=2 + sp");
  // Two virtual stages on one pipeline rank: the stages hand over locally, the tied embedding's
  // copies are summed on the rank.
  expect_same_curve(train(small("pp=1", "interleaved")), reference(4), "interleaved on pp=1");
}

// Each stage's forward draws its micro-batch's dropout masks at the micro-batch's sample offset
// (the backward reads the masks the forward kept): the pipeline follows the one-stage curve.
TEST(PipelineTopology, DropoutOnEveryScheduleFollowsTheOneStageCurve) {
  TrainConfig ref = small("dp=1");
  ref.dropout = 0.1;
  const Curve one = train(ref);
  EXPECT_NE(one.losses[3], reference(4).losses[3]);  // the masks apply
  for (const char* schedule : {"fthenb", "zbh1"}) {
    TrainConfig c = small("pp=2", schedule);
    c.dropout = 0.1;
    expect_same_curve(train(c), one, std::string("dropout, ") + schedule + " on pp=2");
  }
}

TEST(PipelineTopology, ImpossibleConfigurationsAreRefusedBeforeTheStart) {
  auto message = [](TrainConfig c) {
    try {
      c.check(mesh::parse_mesh(c.parallel.mesh).size());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig few = small("pp=4", "zbh1");
  few.optimizer.accumulation = 2, few.optimizer.global_batch = 4;
  EXPECT_NE(message(few).find("zbh1: 2 micro-batches for 4 pipeline ranks"), std::string::npos) << message(few);
  EXPECT_NE(message(small("pp=4", "interleaved")).find("4 layers cannot fill 8 pipeline stages"), std::string::npos);
  EXPECT_EQ(message(small("pp=2", "interleaved", 6)), "no error");  // uneven chunks: test_pipeline_uneven.cc
  EXPECT_NE(message(small("pp=4", "1f1b", 3)).find("3 layers cannot fill 4 pipeline stages"), std::string::npos);
  EXPECT_NE(message(small("pp=2", "2f2b")).find("unknown pipeline schedule '2f2b'"), std::string::npos);
}

}  // namespace
}  // namespace shardwise::train
