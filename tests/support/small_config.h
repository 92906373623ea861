#pragma once
// The small GPT run the trainer tests share: 2 layers, hidden 32, 2-digit addition, batch 8.
#include <string>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

inline TrainConfig small_config(const std::string& mesh, int64_t steps) {
  TrainConfig c;
  c.model.layers = 2, c.model.heads = 4, c.model.hidden = 32, c.model.seq = 10, c.model.vocab = 128;
  c.parallel.mesh = mesh;
  c.optimizer.steps = steps;
  c.optimizer.global_batch = 8;
  c.optimizer.lr = 3e-3, c.optimizer.min_lr = 3e-4, c.optimizer.warmup = 3;
  c.data.digits = 2;
  return c;
}

}  // namespace shardwise::train
