#pragma once
// The run compared with PyTorch: shared by the exporter (tests/golden/export_parity_inputs.cc) and
// the test that replays the golden losses (tests/train/test_golden.cc).
#include <nlohmann/json.hpp>

#include "shardwise/train/trainer.h"

namespace shardwise::golden {

inline train::TrainConfig parity_config() {
  train::TrainConfig c;
  c.model.layers = 2, c.model.heads = 4, c.model.hidden = 64, c.model.seq = 12, c.model.vocab = 128;
  c.mesh = "dp=1";
  c.digits = 3;
  c.steps = 20;
  c.global_batch = 8;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup = 5;
  c.adamw = {0.9, 0.95, 1e-8, 0.1};
  c.clip = 1.0;
  c.seed = 20261122;
  return c;
}

// What the PyTorch script reads (safetensors metadata "config").
inline nlohmann::json parity_config_json(const train::TrainConfig& c) {
  return {{"layers", c.model.layers},   {"heads", c.model.heads},       {"hidden", c.model.hidden},
          {"seq", c.model.seq},         {"vocab", c.model.vocab},       {"layer_norm_epsilon", c.model.layer_norm_epsilon},
          {"steps", c.steps},           {"total_steps", c.steps},       {"lr", c.lr},
          {"min_lr", c.min_lr},         {"warmup", c.warmup},           {"beta1", c.adamw.beta1},
          {"beta2", c.adamw.beta2},     {"epsilon", c.adamw.epsilon},   {"weight_decay", c.adamw.weight_decay},
          {"clip", c.clip},             {"global_batch", c.global_batch}, {"seed", c.seed}};
}

}  // namespace shardwise::golden
