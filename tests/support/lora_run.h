#pragma once
// A LoRA training run the LoRA tests compare across meshes: each step's loss and every adapter's
// whole gradient (rank 0), the frozen base before and after, the parameter counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {

struct LoraRun {
  std::vector<double> losses;
  std::vector<std::map<std::string, Tensor>> grads;  // per step: every adapter's whole gradient
  std::map<std::string, Tensor> frozen_before, frozen_after;
  ParameterCounts counts;
};

inline LoraRun run_lora(const TrainConfig& c, bool grads = true, bool frozen = false) {
  LoraRun out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    t.keep_gradients(grads);
    auto gather_frozen = [&](std::map<std::string, Tensor>& into) {
      for (ParamState& p : t.frozen()) {
        Tensor whole = t.gather_param(p.name);
        if (w.rank() == 0) into[p.name] = whole;
      }
    };
    if (frozen) gather_frozen(out.frozen_before);
    const ParameterCounts counts = t.count_parameters();
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      const double loss = t.step().loss;
      std::map<std::string, Tensor> step_grads;
      for (ParamState& p : t.params()) {
        if (!grads) break;
        Tensor g = t.gather_grad(p.name);
        if (w.rank() == 0) step_grads[p.name] = g;
      }
      if (w.rank() == 0) out.losses.push_back(loss), out.grads.push_back(std::move(step_grads));
    }
    if (frozen) gather_frozen(out.frozen_after);
    if (w.rank() == 0) out.counts = counts;
  });
  return out;
}

inline void expect_same(const LoraRun& got, const LoraRun& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * ref.losses[s]) << what << ": step " << s + 1;
    if (ref.grads[s].empty() || got.grads[s].empty()) continue;
    ASSERT_EQ(got.grads[s].size(), ref.grads[s].size()) << what;
    for (const auto& [name, want] : ref.grads[s]) {
      const Tensor& g = got.grads[s].at(name);
      ASSERT_EQ(g.shape(), want.shape()) << what << " " << name;
      double scale = 0;
      for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.at(i)));
      for (int64_t i = 0; i < want.numel(); ++i) {
        ASSERT_NEAR(g.at(i), want.at(i), 1e-5 * std::max(scale, 1e-6)) << what << ": step " << s + 1 << " " << name
                                                                        << " element " << i;
      }
    }
  }
}

}  // namespace shardwise::train
