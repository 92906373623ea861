#pragma once
// The small Llama the Llama tests train: 2 layers, hidden 32, 4 heads over 2 kv heads (grouped-
// query attention), a SwiGLU MLP of 64, an untied head; 2-digit addition, batch 8 in 2 micro-batches.
#include <string>

#include "shardwise/models/model_io.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {

inline TrainConfig llama_test_config(const std::string& mesh, int64_t steps = 20) {
  TrainConfig c;
  c.model.model_type = "llama";
  c.model.layers = 2, c.model.heads = 4, c.model.kv_heads = 2, c.model.hidden = 32, c.model.seq = 10;
  c.model.vocab = 128, c.model.intermediate_size = 64, c.model.tie_word_embeddings = false;
  c.parallel.mesh = mesh;
  c.optimizer.steps = steps;
  c.optimizer.global_batch = 8;
  c.optimizer.accumulation = 2;  // two micro-batches: a pipeline has work for both stages
  c.optimizer.micro_batch = 0;
  c.optimizer.lr = 3e-3, c.optimizer.min_lr = 3e-4, c.optimizer.warmup = 3;
  c.data.digits = 2;
  return c;
}

// One step on a transformers directory of tests/golden/hf (the model from its config.json) over a
// u16 token file of one sequence: batch 4 in 2 micro-batches, every sample that sequence.
inline TrainConfig golden_fine_tune(const std::string& model_dir, const std::string& tokens, const std::string& mesh) {
  TrainConfig c;
  c.model = read_model_config(model_dir);
  c.parallel.mesh = mesh;
  c.optimizer.steps = 1;
  c.optimizer.global_batch = 4;
  c.optimizer.accumulation = 2;
  c.optimizer.micro_batch = 0;
  c.data.files = tokens;
  c.data.format = "u16";
  return c;
}

}  // namespace shardwise::train
