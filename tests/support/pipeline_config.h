#pragma once
// The small GPT the pipeline tests train (threads and MPI alike): 20 steps of 4 micro-batches.
#include <string>

#include "shardwise/train/trainer.h"

namespace shardwise::train {

inline TrainConfig pipeline_test_config(const std::string& mesh, const std::string& schedule = "1f1b", int layers = 4) {
  TrainConfig c;
  c.model.layers = layers, c.model.heads = 4, c.model.hidden = 32, c.model.seq = 10, c.model.vocab = 128;
  c.parallel.mesh = mesh;
  c.parallel.schedule = schedule;
  c.parallel.virtual_stages = schedule == "interleaved" ? 2 : 1;
  c.optimizer.steps = 20;
  c.optimizer.global_batch = 8;
  c.optimizer.accumulation = 4;  // 4 micro-batches of 2 sequences (x dp)
  c.optimizer.micro_batch = 0;
  c.optimizer.lr = 3e-3, c.optimizer.min_lr = 3e-4, c.optimizer.warmup = 3;
  c.data.eval_samples = 16;
  c.data.digits = 2;
  return c;
}

}  // namespace shardwise::train
