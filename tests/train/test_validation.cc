// Validation of --data runs (Trainer::validate): the same loss on every mesh, equal to a plain
// reference forward written here, and no effect on the training trajectory.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "tests/support/reference_gpt.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

// A headerless uint16 corpus (.bin: auto-detected) of `n` tokens below `vocab` with some structure
// to learn (each token mostly follows from the one before).
fs::path corpus(const std::string& name, uint32_t n, uint32_t vocab) {
  fs::path d = fs::temp_directory_path() / "shardwise-validation";
  fs::create_directories(d);
  fs::path p = d / (name + ".bin");
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint32_t t = 1;
  for (uint32_t i = 0; i < n; ++i) {
    t = (t * 5 + 3 + (i % 11 == 0 ? i % 7 : 0)) % vocab;
    out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
  }
  return p;
}

TrainConfig val_config(const std::string& mesh, const fs::path& data) {
  TrainConfig c;
  c.model.layers = 2, c.model.heads = 4, c.model.hidden = 32, c.model.seq = 16, c.model.vocab = 64;
  c.parallel.mesh = mesh;
  c.optimizer.steps = 20;
  c.optimizer.global_batch = 8;
  c.optimizer.lr = 1e-2, c.optimizer.min_lr = 1e-3, c.optimizer.warmup = 1;
  c.data.files = data.string();
  c.data.val_fraction = 0.25;
  c.data.val_samples = 6;  // not a multiple of any micro-batch below: the last one is padded
  return c;
}

int ranks_of(const TrainConfig& c) { return static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()); }

// The validation loss before training and after `steps` steps (rank 0's; every rank must agree).
std::vector<double> validation_losses(const TrainConfig& c, int steps) {
  std::vector<double> out;
  comm::LocalWorld::run(ranks_of(c), [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    std::vector<double> mine = {t.validate().loss};
    for (int s = 0; s < steps; ++s) t.step();
    mine.push_back(t.validate().loss);
    if (w.rank() == 0) out = mine;
  });
  return out;
}

TEST(Validation, TheLossIsTheSameOnEveryMesh) {
  fs::path data = corpus("meshes", 6000, 64);
  std::vector<double> ref = validation_losses(val_config("dp=1", data), 3);
  ASSERT_EQ(ref.size(), 2u);
  EXPECT_LT(ref[1], ref[0]) << "three steps should lower the validation loss";
  struct Case {
    std::string mesh;
    bool sp = false;
    int64_t accumulation = 0;
  };
  for (const Case& k : {Case{"dp=2"}, Case{"tp=2"}, Case{"dp=2,tp=2"}, Case{"tp=2", true}, Case{"pp=2", false, 2},
                        Case{"pp=2,dp=2", false, 2}}) {
    TrainConfig c = val_config(k.mesh, data);
    c.parallel.sequence_parallel = k.sp;
    c.optimizer.accumulation = k.accumulation;
    std::vector<double> got = validation_losses(c, 3);
    ASSERT_EQ(got.size(), 2u);
    const std::string what = k.mesh + (k.sp ? " + sp" : "");
    EXPECT_NEAR(got[0], ref[0], 1e-5) << what << ", before training";
    EXPECT_NEAR(got[1], ref[1], 1e-5) << what << ", after 3 steps";
  }
}

// The reference mean over the run's validation sequences, with the trainer's current weights.
double reference_loss(Trainer& t) {
  const reference::Params p = reference::whole_params(t);
  const EvenWindows& val = *t.validation_data();
  std::vector<int64_t> tokens(static_cast<size_t>(t.config().model.seq + 1));
  double total = 0;
  for (int64_t k = 0; k < val.size(); ++k) {
    val.sample(k, tokens);
    total += reference::sequence_loss(tokens, p, t.config().model);
  }
  return total / static_cast<double>(val.size() * t.config().model.seq);
}

// With --dropout too: validation runs without it.
TEST(Validation, TheLossEqualsAPlainReferenceForward) {
  TrainConfig c = val_config("dp=1", corpus("reference", 6000, 64));
  c.dropout = 0.1;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    ASSERT_EQ(t.validation_data()->size(), 6);
    const double at_start = reference_loss(t);
    EXPECT_NEAR(t.validate().loss, at_start, 1e-5) << "step 0";
    EXPECT_EQ(t.validate().loss, t.validate().loss);
    for (int s = 0; s < 6; ++s) t.step();
    const double trained = reference_loss(t);
    EXPECT_LT(trained, at_start - 0.1) << "the weights should have moved away from the initial ones";
    ValidationResult v = t.validate();
    EXPECT_NEAR(v.loss, trained, 1e-5) << "after 6 steps";
    EXPECT_EQ(v.sequences, 6);
    EXPECT_DOUBLE_EQ(v.perplexity(), std::exp(v.loss));
  });
}

// ---- no effect on training ----------------------------------------------------------------------

// Rank 0's training losses, with validate() after every step or not at all.
std::vector<double> training_losses(const TrainConfig& c, int steps, bool validate) {
  std::vector<double> out;
  comm::LocalWorld::run(ranks_of(c), [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int s = 0; s < steps; ++s) {
      double loss = t.step().loss;
      if (validate) t.validate();
      if (w.rank() == 0) out.push_back(loss);
    }
  });
  return out;
}

TEST(Validation, TrainingLossesAreBitIdenticalWithAndWithoutIt) {
  fs::path data = corpus("trajectory", 6000, 64), val = corpus("trajectory-val", 1500, 64);
  // --val-fraction with dropout (masks are keyed by sample: validation must draw none).
  TrainConfig held = val_config("dp=2,tp=2", data);
  held.dropout = 0.1;
  std::vector<double> with = training_losses(held, 4, true), without = training_losses(held, 4, false);
  ASSERT_EQ(with.size(), 4u);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i], without[i]) << "--val-fraction, step " << i + 1;
  // --val-data leaves the training data as it is: the same losses as a run without validation.
  TrainConfig plain = val_config("pp=2", data);
  plain.optimizer.accumulation = 2, plain.dropout = 0.1, plain.data.val_fraction = 0;
  TrainConfig separate = plain;
  separate.data.val_data = val.string();
  with = training_losses(separate, 4, true), without = training_losses(plain, 4, false);
  ASSERT_EQ(with.size(), 4u);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i], without[i]) << "--val-data on pp=2, step " << i + 1;
}

// A corpus whose tokens are their own positions: everything the run trained on lies before the cut.
TEST(Validation, TrainingNeverReadsTheHeldOutTokens) {
  fs::path p = fs::temp_directory_path() / "shardwise-validation" / "positions.bin";
  fs::create_directories(p.parent_path());
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    for (uint32_t t = 0; t < 3000; ++t) out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
  }
  TrainConfig c = val_config("dp=2", p);
  c.model.layers = 1, c.model.vocab = 3000, c.data.val_fraction = 0.2;  // the cut: token 2400
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int s = 0; s < 3; ++s) t.step();
    t.validate();
    if (w.rank() != 0) return;
    const auto* training = dynamic_cast<const TokenFile*>(&t.dataset());
    ASSERT_NE(training, nullptr);
    EXPECT_EQ(training->token_count(), 2400);
    EXPECT_EQ(t.consumed_samples(), 24);
    std::vector<int64_t> w_tokens(17);
    for (int64_t i = 0; i < t.consumed_samples(); ++i) {
      t.dataset().sample(i, w_tokens);
      EXPECT_LT(w_tokens.back(), 2400) << "training sample " << i;
    }
    const EvenWindows& val = *t.validation_data();
    EXPECT_EQ(val.size(), 6);
    for (int64_t k = 0; k < val.size(); ++k) {
      val.sample(k, w_tokens);
      EXPECT_GE(w_tokens.front(), 2400) << "validation sequence " << k;
    }
  });
}

}  // namespace
}  // namespace shardwise::train
