#pragma once
// A GPT-2 block for the runtime tests: token + position embedding, pre-LayerNorm causal
// multi-head attention and GELU MLP with residuals, a tied LM head and cross-entropy.
#include <map>
#include <string>

#include "shardwise/graph/graph.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::testing_support {

struct BlockConfig {
  int64_t batch = 4, seq = 8, hidden = 16, heads = 4, vocab = 12;
  bool vocab_parallel_loss = false;  // vocab_parallel_cross_entropy instead of cross_entropy
  bool embedding = true;  // false: the block reads a parameter "x" (a previous layer's output) and its loss is mean(out^2)
};

// Builds the block; `placements` annotates values by name.
void build_block(graph::Graph& g, const BlockConfig& c, const std::map<std::string, std::string>& placements);
// Random parameters and inputs for it (float32), the same for every run.
std::map<std::string, Tensor> block_data(const BlockConfig& c);

}  // namespace shardwise::testing_support
