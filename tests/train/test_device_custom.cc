// Models built outside the built-in builders (models/custom.h; the Python package's shardwise.nn
// models) on the fake device: GPT-2 through the custom path gives the built-in GPT-2's CPU run bit
// for bit (losses, gradient norms, the masters after the last step) on 1 rank, dp=2, tp=2 and pp=2
// threads; a model fed batches by the caller (least squares) has its feeds copied to the device,
// trains as on the CPU bit for bit, and validates (fed_loss) as on the CPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/support/custom_models.h"
#include "tests/support/device_trainer.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

TEST_F(FakeDeviceTest, ACustomModelTrainsOnTheDeviceAsTheBuiltInModelOnTheCpu) {
  for (const std::string mesh : {"dp=1", "dp=2", "tp=2", "pp=2"}) {
    const TrainConfig builtin = small_config(mesh, 3);
    TrainConfig custom = builtin;
    int builds = 0;
    custom.model.custom = gpt_as_custom(builtin.model, &builds);
    custom.device = kFake;
    const Curve cpu = run_curve(builtin, 3), dev = run_curve(custom, 3);
    ASSERT_EQ(dev.losses.size(), 3u) << mesh;
    EXPECT_EQ(dev.losses, cpu.losses) << mesh;
    EXPECT_EQ(dev.norms, cpu.norms) << mesh;
    EXPECT_GT(builds, 0) << mesh;
    for (const auto& [param, whole] : cpu.params) {  // (none gathered on pp meshes)
      ASSERT_TRUE(dev.params.contains(param)) << mesh << " " << param;
      EXPECT_EQ(std::memcmp(dev.params.at(param).raw(), whole.raw(), whole.nbytes()), 0) << mesh << " " << param;
    }
  }
}

TEST_F(FakeDeviceTest, AModelFedByTheCallerTrainsAndValidatesOnTheDeviceAsOnTheCpu) {
  for (const auto& [mesh, micro_batch] : {std::pair{"dp=1", 0}, std::pair{"dp=2", 0}, std::pair{"dp=2", 2}}) {
    TrainConfig c = small_config(mesh, 3);
    c.optimizer.micro_batch = micro_batch;
    c.model.custom = fed_least_squares(8);
    const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
    std::vector<double> validated[2];
    const Curve cpu = run_curve(c, 3);
    for (const bool device : {false, true}) {
      TrainConfig run = c;
      if (device) run.device = kFake;
      comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
        Trainer t(run, w.group(w.members()));
        t.step();
        const double loss = t.validate().loss;
        if (w.rank() == 0) validated[device ? 1 : 0].push_back(loss);
      });
    }
    c.device = kFake;
    const Curve dev = run_curve(c, 3);
    EXPECT_EQ(dev.losses, cpu.losses) << mesh << " micro-batch " << micro_batch;
    EXPECT_EQ(dev.norms, cpu.norms) << mesh << " micro-batch " << micro_batch;
    EXPECT_LT(dev.losses.back(), dev.losses.front());  // it trains
    EXPECT_EQ(validated[1], validated[0]) << mesh << " micro-batch " << micro_batch;
    EXPECT_EQ(std::memcmp(dev.params.at("w").raw(), cpu.params.at("w").raw(), cpu.params.at("w").nbytes()), 0);
  }
}

}  // namespace
}  // namespace shardwise::train
