#pragma once
// transformers' generation replayed through the Generator: tests/golden/hf/<golden> (a model saved
// by save_pretrained) and <golden>_expected.json (its logits at the last position of `tokens` and
// its greedy tokens after `greedy_prompt`, written by tools/hf_parity.py or tools/hf_mixtral.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/generate/generate.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/models/model_io.h"

namespace shardwise::train {

inline const std::string kHfGoldenDir = std::string(SHARDWISE_SOURCE_DIR) + "/tests/golden/hf";

// On every mesh of `meshes`, the model of directory `dir`: the token after the first tokens gives
// the logits of `want` ("tokens", "last_logits", "argmax") within 1e-5 and its argmax, and greedy
// decoding (stopping at transformers' `eos_id`) gives its tokens ("greedy_prompt", "greedy"), with
// and without the kv cache.
inline void expect_logits_and_greedy(const std::string& dir, const nlohmann::json& want,
                                     const std::vector<std::string>& meshes, int64_t eos_id) {
  const GptConfig model = read_model_config(dir);
  const auto tokens = want["tokens"].get<std::vector<int64_t>>();
  for (const std::string& mesh : meshes) {
    comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh).size()), [&](comm::Communicator& w) {
      auto world = w.group(w.members());
      const int64_t process = world->members()[static_cast<size_t>(world->rank())];
      const Strategy strategy = Strategy::from_mesh(mesh::parse_mesh(mesh), false);
      Generator gen(model, strategy, world, checkpoint_weights(dir, model, process, strategy.pp >= 0));
      GenerateConfig one;
      one.max_new_tokens = 1;
      one.keep_logits = true;
      GenerateResult r = gen.generate({std::vector<int64_t>(tokens.begin(), tokens.end() - 1)}, one);
      const auto& row = r.sequences[0].logits.at(0);
      const auto ref = want["last_logits"].get<std::vector<double>>();
      ASSERT_EQ(row.size(), ref.size());
      double worst = 0;
      for (size_t v = 0; v < ref.size(); ++v) worst = std::max(worst, std::abs(row[v] - ref[v]));
      EXPECT_LE(worst, 1e-5) << mesh;
      EXPECT_EQ(r.sequences[0].tokens[0], want["argmax"].back().get<int64_t>()) << mesh;
      GenerateConfig greedy;
      greedy.max_new_tokens = 8;
      greedy.eos_id = eos_id;
      const auto prompt = want["greedy_prompt"].get<std::vector<int64_t>>();
      const auto all = want["greedy"].get<std::vector<int64_t>>();
      const std::vector<int64_t> expected(all.begin() + static_cast<int64_t>(prompt.size()), all.end());
      EXPECT_EQ(gen.generate({prompt}, greedy).sequences[0].tokens, expected) << mesh;
      greedy.kv_cache = false;
      EXPECT_EQ(gen.generate({prompt}, greedy).sequences[0].tokens, expected) << mesh << " without the cache";
    });
  }
}

// The same for tests/golden/hf/<golden> and <golden>_expected.json (transformers' numbers).
inline void expect_transformers_logits_and_greedy(const std::string& golden, const std::vector<std::string>& meshes,
                                                  int64_t eos_id) {
  std::ifstream f(kHfGoldenDir + "/" + golden + "_expected.json");
  expect_logits_and_greedy(kHfGoldenDir + "/" + golden, nlohmann::json::parse(f), meshes, eos_id);
}

}  // namespace shardwise::train
