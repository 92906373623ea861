// A step whose loss or gradient norm is not finite stops the run before the update (the parameters
// stay those of the last good step), or, opted in, is skipped and counted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <map>
#include <string>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

// An absurd learning rate without clipping overflows within a few steps.
TrainConfig diverging(int64_t steps) {
  TrainConfig c = small_config("dp=1", steps);
  c.optimizer.lr = 1e6, c.optimizer.min_lr = 0, c.optimizer.warmup = 0, c.optimizer.clip = 0;
  return c;
}

// Every parameter's bytes (and its fp32 master's, if any), by name.
std::map<std::string, std::vector<std::byte>> param_bytes(Trainer& t) {
  std::map<std::string, std::vector<std::byte>> out;
  for (ParamState& p : t.params()) {
    for (const Tensor* w : {&p.param, &p.master}) {
      if (!w->defined()) continue;
      std::vector<std::byte>& b = out[p.name + (w == &p.master ? " master" : "")];
      b.assign(w->raw(), w->raw() + w->nbytes());
    }
  }
  return out;
}

bool all_finite(Trainer& t) {
  for (ParamState& p : t.params()) {
    const Tensor& w = p.master.defined() ? p.master : p.param;
    for (int64_t i = 0; i < w.numel(); ++i) {
      if (!std::isfinite(w.at(i))) return false;
    }
  }
  return true;
}

TEST(NonFinite, TheRunStopsAtTheFirstNonFiniteStepBeforeTheUpdate) {
  comm::LocalWorld::run(1, [](comm::Communicator& w) {
    Trainer t(diverging(50), w.group(w.members()));
    int64_t good = 0;
    auto last_good = param_bytes(t);  // after the last step that returned
    try {
      for (int s = 0; s < 50; ++s) {
        t.step();
        if (all_finite(t)) good = t.steps_done();
        last_good = param_bytes(t);
      }
      FAIL() << "50 steps at lr 1e6 without clipping stayed finite";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("not finite"), std::string::npos) << msg;
      EXPECT_NE(msg.find("step " + std::to_string(t.steps_done() + 1)), std::string::npos) << msg;
      EXPECT_NE(msg.find("--clip"), std::string::npos) << msg;  // the likely cause is named
      EXPECT_NE(msg.find("--skip-nonfinite-steps"), std::string::npos) << msg;
    }
    EXPECT_TRUE(all_finite(t)) << "the failing step must not update the parameters";
    EXPECT_EQ(t.steps_done(), good);
    const auto now = param_bytes(t);
    for (const auto& [name, bytes] : last_good) {
      EXPECT_TRUE(now.at(name) == bytes) << name << " changed in the failing step";
    }
  });
}

TEST(NonFinite, OptedInTheStepsAreSkippedAndCounted) {
  comm::LocalWorld::run(1, [](comm::Communicator& w) {
    TrainConfig c = diverging(30);
    c.optimizer.skip_nonfinite = true;
    Trainer t(c, w.group(w.members()));
    int64_t skipped = 0;
    for (int s = 0; s < 30; ++s) skipped += t.step().skipped ? 1 : 0;
    EXPECT_GT(skipped, 0);
    EXPECT_EQ(t.skipped_steps(), skipped);
    EXPECT_EQ(t.steps_done(), 30);
    EXPECT_EQ(t.consumed_samples(), 30 * c.optimizer.global_batch);
    EXPECT_TRUE(all_finite(t));
  });
}

}  // namespace
}  // namespace shardwise::train
