// Sharded optimizer state over dp (train/sharding.h): stage 1 (layouts v1 and v2) and stage 2 follow
// plain data parallelism's loss curve on every mesh, hold the ZeRO formula's bytes per rank, and
// checkpoint into whole tensors that load into any other layout and mesh bit for bit.
#include "tests/support/llama_config.h"
#include "shardwise/models/models.h"
#include "tests/support/sharding_runs.h"

namespace shardwise::train {
namespace {

using namespace sharding_test;

TEST(Sharding, V1AssignsParametersGreedilyByElementsAndV2CutsEqualRanges) {
  // v1: 10 -> r0, 7 -> r1, 5 -> r1 (7 < 10), 3 -> r0 (10 < 12), 1 -> r1 (12 < 13).
  ShardPlan v1 = plan_shards("v1", {10, 7, 5, 3, 1}, 2, 1);
  std::vector<std::vector<int64_t>> want1 = {{10, 0}, {0, 7}, {0, 5}, {3, 0}, {0, 1}};
  EXPECT_EQ(v1.counts, want1);
  EXPECT_EQ(v1.owned_elements(), 13);
  EXPECT_EQ(v1.begin(1), 0);
  // v2: 12 elements in ranges [0, 4), [4, 8), [8, 12); the first parameter is cut after 4 elements.
  ShardPlan v2 = plan_shards("v2", {5, 3, 4}, 3, 1);
  std::vector<std::vector<int64_t>> want2 = {{4, 1, 0}, {0, 3, 0}, {0, 0, 4}};
  EXPECT_EQ(v2.counts, want2);
  EXPECT_EQ(v2.begin(0), 4);
  EXPECT_EQ(v2.owned_elements(), 4);
  // 10 over 4 ranks: 2, 3, 2, 3 (floor(10 r / 4) boundaries).
  ShardPlan odd = plan_shards("v2", {10}, 4, 0);
  EXPECT_EQ(odd.counts[0], (std::vector<int64_t>{2, 3, 2, 3}));
}

TEST(Sharding, UnknownStagesAndLayoutsAreRefusedNamingThem) {
  try {
    ShardingConfig{4, "v1"}.check();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--sharding-stage must be 0 (none), 1 (optimizer state), 2 (and gradients) or 3 "
                                         "(and parameters), got 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ShardingConfig({1, "v3"}).check(), Error);
  EXPECT_THROW(ShardingConfig({-1, "v1"}).check(), Error);
  EXPECT_NO_THROW(ShardingConfig({3, "v2"}).check());
}

// Stage 1 (v1, v2, v1 with bf16 masters) and stage 2 (v1, v2) against plain dp on the same mesh,
// 20 steps; the plain curves themselves follow the single-device one (test_topology).
TEST(Sharding, EveryStageAndLayoutFollowsPlainDataParallelOnEveryMesh) {
  int exact = 0, runs = 0;
  for (const std::string mesh : {"dp=2", "dp=4", "dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = small_config(mesh, 20);
    c.optimizer.accumulation = 2, c.optimizer.micro_batch = 0;  // a pipeline needs micro-batches; stage 2 reduces their sum
    const std::vector<double> plain = train(c, 20).losses;
    for (auto [stage, layout] : {std::pair{1, "v1"}, std::pair{1, "v2"}, std::pair{2, "v1"}, std::pair{2, "v2"}}) {
      expect_same_curve(train(sharded(c, stage, layout), 20).losses, plain,
                        fmt::format("{} stage {} {}", mesh, stage, layout), &exact);
      ++runs;
    }
    TrainConfig b = c;
    b.bf16 = true;
    const std::vector<double> plain_bf16 = train(b, 20).losses;
    // Stage 1 reads the graph's all-reduced gradients: the same bits. Stage 2 reduce-scatters the
    // f32 sum of the micro-batches where plain dp all-reduces each micro-batch's gradient in the
    // parameters' dtype (bf16) before summing: fewer roundings, about 3e-5 apart over 20 steps.
    expect_same_curve(train(sharded(c, 1, "v1", true), 20).losses, plain_bf16, mesh + " bf16 stage 1 v1", &exact);
    expect_same_curve(train(sharded(c, 2, "v2", true), 20).losses, plain_bf16, mesh + " bf16 stage 2 v2", &exact, 1e-4);
    runs += 2;
  }
  std::cout << exact << " of " << runs << " sharded curves are bit-identical to plain dp\n";
}

// With activation recompute (full, selective) stage 2 and stage 1 keep plain dp's curve (recompute
// gives the gradients of no recompute).
TEST(Sharding, WithRecomputeTheCurveIsPlainDataParallels) {
  int exact = 0;
  for (const std::string mesh : {"dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = small_config(mesh, 10);
    c.optimizer.accumulation = 2, c.optimizer.micro_batch = 0;
    const std::vector<double> plain = train(c, 10).losses;
    for (const std::string recompute : {"full", "selective"}) {
      TrainConfig r = c;
      r.model.recompute = recompute;
      expect_same_curve(train(sharded(r, 2, "v2"), 10).losses, plain, mesh + " recompute " + recompute + " stage 2 v2",
                        &exact);
      expect_same_curve(train(sharded(r, 1, "v1"), 10).losses, plain, mesh + " recompute " + recompute + " stage 1 v1",
                        &exact);
    }
  }
}

TEST(Sharding, LlamaStageTwoFollowsPlainDataParallel) {
  int exact = 0;
  for (const std::string mesh : {"dp=2,tp=2", "pp=2,dp=2"}) {
    TrainConfig c = llama_test_config(mesh, 10);
    const std::vector<double> plain = train(c, 10).losses;
    expect_same_curve(train(sharded(c, 2, "v2"), 10).losses, plain, mesh + " llama stage 2 v2", &exact);
    expect_same_curve(train(sharded(c, 1, "v1"), 10).losses, plain, mesh + " llama stage 1 v1", &exact);
  }
}

// ZeRO (Rajbhandari et al. 2020): the optimizer state of stage 1 is K x Psi / Nd bytes per rank,
// K = 8 for f32 parameters (two f32 moments; the master is the parameter) and 12 for bf16 ones
// (and an f32 master). Psi from the model's parameter count, not the trainer's blocks.
TEST(Sharding, OptimizerBytesPerRankFollowTheZeroFormula) {
  TrainConfig c = small_config("dp=4", 1);
  const int64_t psi = static_cast<int64_t>(parameter_count(c.model));
  for (int stage : {1, 2}) {
    for (bool bf16 : {false, true}) {
      const int64_t k = bf16 ? 12 : 8;
      // v2: rank r owns floor((r + 1) Psi / 4) - floor(r Psi / 4) elements: K Psi / 4 up to K bytes.
      TrainRun v2 = train(sharded(c, stage, "v2", bf16), 0);
      for (int r = 0; r < 4; ++r)
        EXPECT_EQ(v2.optimizer_bytes[static_cast<size_t>(r)], k * ((r + 1) * psi / 4 - r * psi / 4)) << "rank " << r;
      // v1: whole parameters; together K Psi, each rank within one largest parameter of K Psi / 4.
      TrainRun v1 = train(sharded(c, stage, "v1", bf16), 0);
      int64_t sum = 0;
      const int64_t largest = static_cast<int64_t>(largest_parameter(c.model).second);
      for (int64_t b : v1.optimizer_bytes) {
        sum += b;
        EXPECT_LE(std::abs(b - k * psi / 4), k * largest);
      }
      EXPECT_EQ(sum, k * psi);
    }
  }
  TrainRun plain = train(c, 0);
  for (int64_t b : plain.optimizer_bytes) EXPECT_EQ(b, 8 * psi);
}

// Saved from one layout and mesh, loaded into another: weights, moments and masters bit for bit,
// and the resumed curve continues the uninterrupted one.
TEST(Sharding, CheckpointsMoveBetweenLayoutsAndMeshesBitForBit) {
  for (const LayoutMove& k : std::vector<LayoutMove>{
           {"dp=4", 0, "v1", "dp=2,tp=2", 1, "v2"},  // none -> v2
           {"dp=4", 2, "v2", "pp=2,dp=2", 1, "v1"},  // stage 2 -> v1, with pp
           {"pp=2,dp=2", 1, "v2", "dp=4", 2, "v1"},  // v2 with pp -> stage 2
           {"dp=2,tp=2", 1, "v1", "dp=1", 0, "v1"},  // v1 -> none
       })
    expect_checkpoint_moves(k);
}

TEST(Sharding, Bf16MastersAndMomentsMoveBetweenV1AndStageTwoV2) {
  TrainConfig from = sharded(small_config("dp=2,tp=2", 4), 1, "v1", true);
  TrainConfig to = sharded(small_config("dp=4", 4), 2, "v2", true);
  fs::path root = fresh_dir("bf16");
  TrainRun saved = train(from, 3, {}, root, true);
  fs::path dir = ckpt::find_resume(root)->dir;
  EXPECT_TRUE(fs::exists(dir / "master_weights.safetensors.index.json"));
  expect_same_states(train(to, 0, dir, {}, true).states, saved.states, "bf16 v1 -> stage 2 v2");
  // And into an unsharded run: the same bits as a checkpoint of an unsharded run would give.
  TrainConfig none = from;
  none.parallel.sharding = {};
  expect_same_states(train(none, 0, dir, {}, true).states, saved.states, "bf16 v1 -> none");
  fs::remove_all(root);
}

// --init-from's weights (any checkpoint) land in each rank's shards of the masters; moments stay zero.
TEST(Sharding, InitFromModelFillsEachRanksShards) {
  fs::path root = fresh_dir("init");
  TrainRun saved = train(small_config("tp=2", 3), 3, {}, root, true);
  fs::path dir = ckpt::find_resume(root)->dir;
  TrainConfig c = sharded(small_config("dp=4", 1), 2, "v2", true);
  States got;
  comm::LocalWorld::run(4, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    init_from_model(t, *world, dir);
    States s = gather_states(t, *world);
    if (w.rank() == 0) got = std::move(s);
  });
  ASSERT_FALSE(got.empty());
  for (const auto& [key, t] : got) {
    if (key.ends_with("/master")) {
      CompareResult r = compare(t, saved.states.at(key));
      EXPECT_TRUE(r.equal) << key << ": " << r.message;
    } else {
      for (int64_t j = 0; j < t.numel(); ++j) ASSERT_EQ(t.at(j), 0.0) << key << " element " << j;
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace shardwise::train
