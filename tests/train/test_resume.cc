// Checkpoints of the trainer: saved on one mesh, loaded on another, training continues the loss
// curve of an uninterrupted run; weights and moments come back bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "shardwise/ckpt/commit.h"
#include "shardwise/comm/local.h"
#include "tests/support/small_config.h"
#include "tests/support/train_losses.h"
#include "shardwise/train/checkpointing.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

TrainConfig small(const std::string& mesh) { return small_config(mesh, 16); }

int ranks_of(const std::string& mesh) { return static_cast<int>(mesh::parse_mesh(mesh).size()); }

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-resume-" + name);
  fs::remove_all(d);
  return d;
}

// Trains `steps` steps (after loading `from` when given), saves into `root` at the end when given;
// `state` gets every parameter whole ("<name>") and its moments ("<name>/exp_avg", "/exp_avg_sq").
std::vector<double> train(const std::string& mesh, int64_t steps, const fs::path& from = {}, const fs::path& root = {},
                          std::map<std::string, Tensor>* state = nullptr) {
  return train_losses(small(mesh), steps, from, root, state, /*moments=*/true);
}

TEST(Resume, OnAnotherMeshTheLossCurveContinues) {
  std::vector<double> whole = train("dp=2", 16);
  fs::path root = fresh_dir("curve");
  std::vector<double> first = train("dp=2", 8, {}, root);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_DOUBLE_EQ(first[i], whole[i]);
  auto found = ckpt::find_resume(root);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 8);
  for (const std::string mesh : {"dp=1", "tp=2", "dp=2,tp=2", "tp=4", "dp=2"}) {
    std::vector<double> rest = train(mesh, 8, found->dir);
    ASSERT_EQ(rest.size(), 8u);
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_NEAR(rest[i], whole[8 + i], 1e-5 * whole[8 + i]) << "resumed on " << mesh << ", step " << 9 + i;
    }
  }
}

TEST(Resume, WeightsAndMomentsComeBackBitForBitOnEveryMesh) {
  fs::path root = fresh_dir("bits");
  std::map<std::string, Tensor> saved, loaded;
  train("tp=2", 3, {}, root, &saved);
  fs::path dir = ckpt::find_resume(root)->dir;
  for (const std::string mesh : {"dp=1", "dp=2", "dp=2,tp=2", "tp=4"}) {
    loaded.clear();
    train(mesh, 0, dir, {}, &loaded);
    ASSERT_EQ(loaded.size(), saved.size());
    for (const auto& [name, t] : saved) {  // the weights and both moments of every parameter
      ASSERT_EQ(loaded.at(name).nbytes(), t.nbytes()) << mesh << " " << name;
      EXPECT_EQ(std::memcmp(loaded.at(name).raw(), t.raw(), t.nbytes()), 0) << mesh << " " << name << " differs";
    }
  }
  // The optimizer group holds every parameter's exp_avg and exp_avg_sq.
  std::string index = [&] {
    std::ifstream f(dir / "optimizer.safetensors.index.json");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }();
  EXPECT_NE(index.find("transformer.wte.weight/exp_avg_sq"), std::string::npos);
  nlohmann::json state = ckpt::load_json(dir, "trainer_state.json");
  EXPECT_EQ(state["step"], 3);
  EXPECT_EQ(state["consumed_samples"], 24);
  EXPECT_EQ(state["mesh"], "[tp=2]");
  EXPECT_EQ(state["rng"].size(), 2u);
}

TEST(Resume, Bf16ParametersSaveTheirFp32MastersAndComeBackExactly) {
  fs::path root = fresh_dir("bf16");
  std::map<std::string, Tensor> saved, loaded;
  auto run = [&](const std::string& mesh, int64_t steps, const fs::path& from, const fs::path& to,
                 std::map<std::string, Tensor>& params) {
    comm::LocalWorld::run(ranks_of(mesh), [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      TrainConfig c = small(mesh);
      c.bf16 = true;
      Trainer t(c, world);
      if (!from.empty()) load_trainer(t, *world, from);
      for (int64_t s = 0; s < steps; ++s) t.step();
      if (!to.empty()) save_trainer(t, *world, to);
      for (ParamState& p : t.params()) {
        Tensor g = t.gather_param(p.name);  // the fp32 master
        if (w.rank() == 0) params[p.name] = g;
      }
    });
  };
  run("dp=2", 2, {}, root, saved);
  fs::path dir = ckpt::find_resume(root)->dir;
  EXPECT_TRUE(fs::exists(dir / "master_weights.safetensors.index.json"));
  run("tp=2", 0, dir, {}, loaded);
  for (const auto& [name, t] : saved) {
    CompareResult c = compare(loaded.at(name), t);
    EXPECT_TRUE(c.equal) << name << ": " << c.message;
  }
}

TEST(Resume, AnotherModelIsRefusedNamingTheField) {
  fs::path root = fresh_dir("mismatch");
  train("dp=1", 1, {}, root);
  fs::path dir = ckpt::find_resume(root)->dir;
  std::string message;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    TrainConfig c = small("dp=1");
    c.model.hidden = 64;
    Trainer t(c, world);
    try {
      load_trainer(t, *world, dir);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  EXPECT_NE(message.find("n_embd 32 (checkpoint) vs 64 (this run)"), std::string::npos) << message;
}

TEST(Resume, AsyncSavesOnAScheduleCommitAndResume) {
  fs::path root = fresh_dir("async");
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(small("dp=2"), world);
    ckpt::SaveOptions o;
    o.save_total_limit = 2;
    CheckpointSchedule schedule(root, 2, true, o);
    for (int s = 0; s < 6; ++s) {
      t.step();
      schedule.after_step(t, *world);
    }
    schedule.finish();
  });
  auto all = ckpt::list_checkpoints(root);
  ASSERT_EQ(all.size(), 2u);  // 2, 4, 6 saved; the limit keeps the newest two
  EXPECT_EQ(all[0].step, 4);
  EXPECT_EQ(all[1].step, 6);
  EXPECT_EQ(ckpt::find_resume(root)->step, 6);
}

TEST(Resume, WithDropoutTheSameMeshContinuesTheCurve) {
  TrainConfig c = small("dp=2,tp=2");
  c.dropout = 0.1;
  std::vector<double> whole = train_losses(c, 12, {}, {});
  fs::path root = fresh_dir("dropout");
  train_losses(c, 6, {}, root);
  std::vector<double> rest = train_losses(c, 6, ckpt::find_resume(root)->dir, {});
  ASSERT_EQ(rest.size(), 6u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_NEAR(rest[i], whole[6 + i], 1e-5 * whole[6 + i]) << "step " << 7 + i;
  // Without dropout the curve differs: the masks are really applied.
  c.dropout = 0;
  EXPECT_NE(train_losses(c, 12, {}, {}).back(), whole.back());
}

TEST(Resume, AnotherSeedIsRefusedAndTheGenerationConfigIsWritten) {
  fs::path root = fresh_dir("seed");
  TrainConfig c = small("dp=2");
  train_losses(c, 2, {}, root);
  fs::path dir = ckpt::find_resume(root)->dir;
  nlohmann::json gen = ckpt::load_json(dir, "generation_config.json");
  // 10: '\n', the addition task's separator and padding.
  EXPECT_EQ(gen, (nlohmann::json{{"max_length", 10}, {"do_sample", false}, {"eos_token_id", 10}, {"bos_token_id", 10},
                                 {"pad_token_id", 10}}));
  c.optimizer.seed = 7;
  std::string message;
  try {
    train_losses(c, 0, dir, {});
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("holds generator state seed 1234 at step 2, this run uses --seed 7"), std::string::npos)
      << message;
  EXPECT_NE(message.find("resume with --seed 1234"), std::string::npos) << message;
}

}  // namespace
}  // namespace shardwise::train
