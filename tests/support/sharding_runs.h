#pragma once
// What the sharding tests share (test_sharding.cc: stages 1 and 2; test_sharding_stage3.cc): runs of
// the Trainer on threads, the whole optimizer states gathered, and curve / state comparisons.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "shardwise/comm/local.h"
#include "shardwise/ckpt/commit.h"
#include "shardwise/comm/objects.h"
#include "shardwise/train/checkpointing.h"
#include "tests/support/small_config.h"

namespace shardwise::train::sharding_test {

namespace fs = std::filesystem;

inline TrainConfig sharded(TrainConfig c, int stage, const std::string& layout, bool bf16 = false) {
  c.parallel.sharding = {stage, layout};
  c.bf16 = bf16;
  return c;
}

// The whole master, moments of every parameter (rank 0's view), keyed "<name>/<part>".
using States = std::map<std::string, Tensor>;

inline States gather_states(Trainer& t, comm::Communicator& world) {
  nlohmann::json mine = nlohmann::json::array();
  for (const ParamState& p : t.params()) mine.push_back(p.name);
  std::set<std::string> names;
  for (const nlohmann::json& rank : comm::all_gather_object(world, mine))
    for (const auto& n : rank) names.insert(n.get<std::string>());
  States out;
  for (const std::string& name : names) {
    for (auto [part, field] : {std::pair{"master", &ParamState::master}, std::pair{"exp_avg", &ParamState::exp_avg},
                               std::pair{"exp_avg_sq", &ParamState::exp_avg_sq}}) {
      Tensor whole = t.gather_state(name, field);
      if (world.rank() == 0) out[name + "/" + part] = whole;
    }
  }
  return out;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<int64_t> optimizer_bytes;  // per world rank
  States states;                         // after the last step (with `gather`)
};

// `steps` steps of `c` on threads, after loading `from`, saving into `to` at the end.
inline TrainRun train(const TrainConfig& c, int64_t steps, const fs::path& from = {}, const fs::path& to = {}, bool gather = false) {
  TrainRun r;
  const int ranks = static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size());
  r.optimizer_bytes.assign(static_cast<size_t>(ranks), 0);
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    r.optimizer_bytes[static_cast<size_t>(w.rank())] = t.optimizer_state_bytes();
    if (!from.empty()) load_trainer(t, *world, from);
    for (int64_t s = 0; s < steps; ++s) {
      double l = t.step().loss;
      if (w.rank() == 0) r.losses.push_back(l);
    }
    if (!to.empty()) save_trainer(t, *world, to);
    if (gather) {
      States s = gather_states(t, *world);
      if (w.rank() == 0) r.states = std::move(s);
    }
  });
  return r;
}

inline fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("shardwise-sharding-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  return d;
}

inline void expect_same_curve(const std::vector<double>& got, const std::vector<double>& want, const std::string& what,
                       int* bit_exact, double rtol = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  bool exact = true;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * want[i]) << what << " step " << i + 1;
    exact = exact && got[i] == want[i];
  }
  if (exact) ++*bit_exact;
  else std::cout << what << ": within " << rtol << ", not bit-identical\n";
}

inline void expect_same_states(const States& got, const States& want, const std::string& what) {
  ASSERT_FALSE(want.empty()) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, t] : want) {
    CompareResult c = compare(got.at(key), t);
    EXPECT_TRUE(c.equal) << what << " " << key << ": " << c.message;
  }
}

// A checkpoint saved after 4 of 8 steps of one layout and mesh, loaded into another.
struct LayoutMove {
  std::string from_mesh;
  int from_stage;
  std::string from_layout;
  std::string to_mesh;
  int to_stage;
  std::string to_layout;
};

// Saved as `k.from_*`, loaded as `k.to_*`: the trainer state names the saving layout, the files hold
// whole tensors under the unsharded keys (GPT-2's fused c_attn, the moments beside the weights),
// weights, moments and masters arrive bit for bit, and the resumed curve continues the
// uninterrupted one within 1e-5.
inline void expect_checkpoint_moves(const LayoutMove& k) {
  const std::string what = fmt::format("{} stage {} {} -> {} stage {} {}", k.from_mesh, k.from_stage, k.from_layout,
                                       k.to_mesh, k.to_stage, k.to_layout);
  TrainConfig from = sharded(small_config(k.from_mesh, 8), k.from_stage, k.from_layout);
  TrainConfig to = sharded(small_config(k.to_mesh, 8), k.to_stage, k.to_layout);
  from.optimizer.accumulation = to.optimizer.accumulation = 2, from.optimizer.micro_batch = to.optimizer.micro_batch = 0;
  const std::vector<double> whole = train(to, 8).losses;
  fs::path root = fresh_dir("layouts");
  TrainRun saved = train(from, 4, {}, root, true);
  fs::path dir = ckpt::find_resume(root)->dir;
  nlohmann::json state = ckpt::load_json(dir, "trainer_state.json");
  EXPECT_EQ(state["sharding"]["stage"], k.from_stage) << what;
  EXPECT_EQ(state["sharding"]["layout"], k.from_layout) << what;
  nlohmann::json index = ckpt::load_json(dir, "model.safetensors.index.json");
  EXPECT_TRUE(index["weight_map"].contains("transformer.h.0.attn.c_attn.weight")) << what;
  EXPECT_TRUE(index["weight_map"].contains("transformer.wte.weight")) << what;
  nlohmann::json moments = ckpt::load_json(dir, "optimizer.safetensors.index.json");
  EXPECT_TRUE(moments["weight_map"].contains("transformer.wte.weight/exp_avg")) << what;
  TrainRun loaded = train(to, 0, dir, {}, true);
  expect_same_states(loaded.states, saved.states, what);
  std::vector<double> rest = train(to, 4, dir).losses;
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_NEAR(rest[i], whole[4 + i], 1e-5 * whole[4 + i]) << what;
  fs::remove_all(root);
}

}  // namespace shardwise::train::sharding_test
