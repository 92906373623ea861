#pragma once
// generate() of a model given as whole tensors on a mesh's ranks as threads; every rank must return
// the same tokens (rank 0's result is returned).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/generate/generate.h"

namespace shardwise::train {

inline GenerateResult generate_with_weights(const GptConfig& model, const std::map<std::string, Tensor>& weights,
                                            const std::string& mesh, const std::vector<std::vector<int64_t>>& prompts,
                                            const GenerateConfig& config) {
  const int ranks = static_cast<int>(mesh::parse_mesh(mesh).size());
  std::vector<GenerateResult> results(static_cast<size_t>(ranks));
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Generator gen(model, Strategy::from_mesh(mesh::parse_mesh(mesh), false), world,
                  whole_weights(weights, world->members()[static_cast<size_t>(world->rank())]));
    results[static_cast<size_t>(w.rank())] = gen.generate(prompts, config);
  });
  for (int r = 1; r < ranks; ++r)
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(results[static_cast<size_t>(r)].sequences[i].tokens, results[0].sequences[i].tokens)
          << mesh << ": rank " << r << ", prompt " << i;
  return results[0];
}

}  // namespace shardwise::train
