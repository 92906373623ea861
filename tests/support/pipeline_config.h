#pragma once
// The small GPT the pipeline tests train (threads and MPI alike): 20 steps of 4 micro-batches.
#include <string>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

inline TrainConfig pipeline_test_config(const std::string& mesh, const std::string& schedule = "1f1b", int layers = 4) {
  TrainConfig c;
  c.model.layers = layers, c.model.heads = 4, c.model.hidden = 32, c.model.seq = 10, c.model.vocab = 128;
  c.mesh = mesh;
  c.schedule = schedule;
  c.virtual_stages = schedule == "interleaved" ? 2 : 1;
  c.steps = 20;
  c.global_batch = 8;
  c.accumulation = 4;  // 4 micro-batches of 2 sequences (x dp)
  c.micro_batch = 0;
  c.lr = 3e-3, c.min_lr = 3e-4, c.warmup = 3;
  c.eval_samples = 16;
  c.digits = 2;
  return c;
}

}  // namespace shardwise::train
