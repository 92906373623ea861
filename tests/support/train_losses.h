#pragma once
// The training loop the resume tests share: `steps` steps of `c` on its mesh (threads), after
// loading `from` when given, saving into `save_to` at the end when given; rank 0's losses, and in
// `params` when given every parameter whole ("<name>") and, with `moments`, its fp32 master and
// AdamW moments ("<name>" the master, "<name>/exp_avg", "<name>/exp_avg_sq").
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/train/checkpointing.h"

namespace shardwise::train {

inline std::vector<double> train_losses(const TrainConfig& c, int64_t steps, const std::filesystem::path& from,
                                        const std::filesystem::path& save_to,
                                        std::map<std::string, Tensor>* params = nullptr, bool moments = false) {
  std::vector<double> losses;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    if (!from.empty()) load_trainer(t, *world, from);
    for (int64_t s = 0; s < steps; ++s) {
      double l = t.step().loss;
      if (w.rank() == 0) losses.push_back(l);
    }
    if (!save_to.empty()) save_trainer(t, *world, save_to);
    if (params) {
      for (ParamState& p : t.params()) {
        if (!moments) {
          Tensor g = t.gather_param(p.name);
          if (w.rank() == 0) (*params)[p.name] = g;
          continue;
        }
        const std::pair<const char*, Tensor ParamState::*> parts[] = {
            {"", &ParamState::master}, {"/exp_avg", &ParamState::exp_avg}, {"/exp_avg_sq", &ParamState::exp_avg_sq}};
        for (auto [suffix, field] : parts) {
          Tensor g = t.gather_state(p.name, field);
          if (w.rank() == 0) (*params)[p.name + suffix] = g;
        }
      }
    }
  });
  return losses;
}

// Rank 0's loss of the first step of `c` (before any update) after init_from_model(`from`).
inline double init_from_first_loss(const TrainConfig& c, const std::filesystem::path& from) {
  double loss = 0;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Trainer t(c, world);
    init_from_model(t, *world, from);
    const double l = t.step().loss;
    if (w.rank() == 0) loss = l;
  });
  return loss;
}

}  // namespace shardwise::train
