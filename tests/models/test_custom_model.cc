// GptConfig::custom (models/custom.h): a model whose graph and initial values come from outside the
// built-in builders is trained by the same Trainer. The reference is the built-in GPT-2 itself:
// a CustomModel that builds build_gpt's graph and draws init_param's values must give the built-in
// run's losses bit for bit on every mesh; what it does not build (pipeline stages) is refused. A
// model fed batches of its own (CustomModel::feeds) is checked against the exact formula.
#include <gtest/gtest.h>

#include <tuple>

#include "shardwise/models/custom.h"
#include "shardwise/models/models.h"
#include "tests/support/custom_models.h"
#include "tests/support/error_of.h"
#include "tests/support/golden_losses.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

TEST(CustomModel, TrainsAsTheBuiltInModelBitForBitOnEveryMesh) {
  for (const std::string mesh : {"dp=1", "dp=2", "tp=2", "dp=2,tp=2"}) {
    const TrainConfig builtin = small_config(mesh, 4);
    TrainConfig custom = builtin;
    int builds = 0;
    custom.model.custom = gpt_as_custom(builtin.model, &builds);
    const int ranks = mesh == "dp=1" ? 1 : mesh == "dp=2,tp=2" ? 4 : 2;
    EXPECT_EQ(run_losses(custom, ranks), run_losses(builtin, ranks)) << mesh;
    EXPECT_GE(builds, ranks) << mesh;  // every rank built its graph through the custom model
  }
}

TEST(CustomModel, AWrongInitialValueChangesTheLosses) {
  // The comparison above can fail: one parameter drawn with another std changes the losses.
  const TrainConfig builtin = small_config("dp=1", 2);
  TrainConfig custom = builtin;
  int builds = 0;
  auto model = std::const_pointer_cast<CustomModel>(gpt_as_custom(builtin.model, &builds));
  auto init = model->init;
  model->init = [init](const std::string& name) {
    ParamInit i = init(name);
    if (name == "transformer.wpe.weight") i.std *= 2;
    return i;
  };
  custom.model.custom = model;
  EXPECT_NE(run_losses(custom, 1), run_losses(builtin, 1));
}

TEST(CustomModel, PipelineStagesTrainAsTheBuiltInModels) {
  // pp=2 (its stages on two ranks, the tied embedding's gradients summed across them) and
  // dp=2 x pp=2: the built-in run's losses bit for bit.
  for (const auto& [mesh, ranks] : {std::pair{"pp=2", 2}, std::pair{"dp=2,pp=2", 4}}) {
    const TrainConfig builtin = small_config(mesh, 3);
    TrainConfig custom = builtin;
    int builds = 0;
    custom.model.custom = gpt_as_custom(builtin.model, &builds);
    EXPECT_EQ(run_losses(custom, ranks), run_losses(builtin, ranks)) << mesh;
  }
}

// The least-squares loss of fed_least_squares(8)'s batch at w = 0.5.
double least_squares_initial_loss() {
  double expected = 0;
  for (int i = 0; i < 8; ++i) {
    const double e = 0.5 * (3.0 * i + 0.75) - (i / 2.0 - 1);
    expected += e * e / 8;
  }
  return expected;
}

// fed_least_squares(8) trained 2 steps on one rank, on dp=2 (each rank 4 rows) and with two
// micro-batches of 4 accumulated on dp=2: check(config, ranks, what) for each.
template <class Check>
void for_each_fed_mesh(Check check) {
  for (const auto& [mesh, ranks, micro_batch] : {std::tuple{"dp=1", 1, 0}, std::tuple{"dp=2", 2, 0},
                                                  std::tuple{"dp=2", 2, 2}}) {
    TrainConfig c = small_config(mesh, 2);
    c.optimizer.micro_batch = micro_batch;
    c.model.custom = fed_least_squares(8);
    check(c, ranks, std::string(mesh) + " micro-batch " + std::to_string(micro_batch));
  }
}

TEST(CustomModel, FedBatchesGiveEachRankItsRows) {
  // The first step's loss (before any update) is the formula's over all 8 rows.
  const double expected = least_squares_initial_loss();
  for_each_fed_mesh([&](const TrainConfig& c, int ranks, const std::string& what) {
    const std::vector<double> losses = run_losses(c, ranks);
    ASSERT_EQ(losses.size(), 2u) << what;
    EXPECT_NEAR(losses[0], expected, 1e-5 * expected) << what;
    EXPECT_LT(losses[1], losses[0]) << what;  // and it trains
  });
}

TEST(CustomModel, ValidatingAFedBatchGivesItsLossWithoutTraining) {
  // validate() of a fed model: the formula's loss of the batch it holds, on every rank; twice the
  // same (it updates nothing), the next step's loss, and after that step the updated w's lower loss.
  const double expected = least_squares_initial_loss();
  for_each_fed_mesh([&](const TrainConfig& c, int ranks, const std::string& what) {
    comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      const ValidationResult first = t.validate();
      EXPECT_NEAR(first.loss, expected, 1e-5 * expected) << what;
      EXPECT_EQ(first.sequences, 8) << what;
      EXPECT_EQ(t.validate().loss, first.loss) << what;
      EXPECT_NEAR(t.step().loss, first.loss, 1e-6 * expected) << what;
      EXPECT_LT(t.validate().loss, first.loss) << what;
    });
  });
}

TEST(CustomModel, ThePredictionsGraphIsRefusedWithTheModelsName) {
  TrainConfig c = small_config("dp=1", 1);
  int builds = 0;
  c.model.custom = gpt_as_custom(c.model, &builds);
  const std::string error = error_of([&] {
    comm::LocalWorld::run(1, [&](comm::Communicator& w) { Trainer(c, w.group(w.members())).evaluate(); });
  });
  EXPECT_NE(error.find("GPT-2 through CustomModel"), std::string::npos) << error;
  EXPECT_NE(error.find("predictions"), std::string::npos) << error;
}

}  // namespace
}  // namespace shardwise::train
