// Pipeline training over 4 MPI processes (ctest runs this under mpirun -np 4): 20 steps of every
// schedule on pp=4, pp=2 x dp=2 and pp=2 x tp=2 follow the single-rank loss curve, which each
// process computes itself on a one-thread local world (an independent reference).
#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "shardwise/comm/mpi.h"
#include "tests/support/pipeline_config.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

TrainConfig small(const std::string& mesh, const std::string& schedule, int layers) {
  return pipeline_test_config(mesh, schedule, layers);
}

std::vector<double> losses(const TrainConfig& c, std::shared_ptr<comm::Communicator> world) {
  Trainer t(c, world);
  std::vector<double> out;
  for (int64_t s = 0; s < c.optimizer.steps; ++s) out.push_back(t.step().loss);
  return out;
}

std::vector<double> reference(int layers) {
  std::vector<double> out;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) { out = losses(small("dp=1", "1f1b", layers), w.group(w.members())); });
  return out;
}

TEST(MpiPipeline, EveryScheduleOnFourProcessesFollowsTheSingleRankCurve) {
  auto world = comm::mpi_world();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4";
  const std::vector<double> ref4 = reference(4), ref8 = reference(8);
  for (const char* mesh : {"pp=4", "pp=2,dp=2", "pp=2,tp=2"}) {
    for (const char* schedule : {"fthenb", "1f1b", "interleaved", "zbh1"}) {
      // Interleaving 2 virtual stages on 4 pipeline ranks takes 8 layers.
      const int layers = std::string(mesh) == "pp=4" && std::string(schedule) == "interleaved" ? 8 : 4;
      const std::vector<double>& ref = layers == 8 ? ref8 : ref4;
      std::vector<double> got = losses(small(mesh, schedule, layers), world);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(got[i], ref[i], 1e-5 * std::abs(ref[i])) << schedule << " on " << mesh << ": step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace shardwise::train
