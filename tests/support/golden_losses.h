#pragma once
// Per-step losses of a reference run replayed: a golden file tests/golden/<file> (written by a
// PyTorch or transformers script from shardwise's exported initial weights and batches) holds the
// configuration it was made for and its losses; the trainer must reproduce them within 1e-4
// relative (or the test's stated tolerance) on every mesh given.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/comm/local.h"
#include "tests/golden/parity_config.h"

namespace shardwise::train {

// `make_target`: the make target that writes the file, named when it is missing.
inline nlohmann::json golden_losses(const std::string& file, const std::string& make_target) {
  std::ifstream f(std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/" + file);
  EXPECT_TRUE(f.good()) << "tests/golden/" << file << " is missing: run `make " << make_target << "`";
  return nlohmann::json::parse(f);
}

// Rank 0's loss at each of c.steps steps on `ranks` thread ranks.
inline std::vector<double> run_losses(const TrainConfig& c, int ranks) {
  std::vector<double> losses;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      double l = t.step().loss;
      if (w.rank() == 0) losses.push_back(l);
    }
  });
  return losses;
}

// `g`'s losses on each (mesh, ranks) of `meshes`, within `rtol` relative; `reference` names the
// reference in the printed figure.
inline void expect_golden_losses(const nlohmann::json& g, TrainConfig c,
                                 const std::vector<std::pair<std::string, int>>& meshes, const std::string& reference,
                                 double rtol = 1e-4) {
  ASSERT_EQ(g["config"], golden::parity_config_json(c)) << "the golden file was made for another configuration";
  std::vector<double> want = g["losses"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<int64_t>(want.size()), c.optimizer.steps);
  for (auto [mesh, ranks] : meshes) {
    c.parallel.mesh = mesh;
    std::vector<double> got = run_losses(c, ranks);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << mesh << ": step " << i + 1;
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    }
    std::cout << "largest relative difference from " << reference << " on " << mesh << ": " << worst << "\n";
  }
  EXPECT_LT(want.back(), want.front()) << "the reference run should learn";
}

}  // namespace shardwise::train
