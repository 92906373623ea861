// Generation on pp meshes (Generator::cut_stages): the stages run in turn for each token, each on
// its stage's mesh with its layers' cache, and the greedy tokens equal one rank's, the kept logits
// within 1e-5 (tp sums its row-parallel products in another order). GPT-2 (4 layers, the tied
// head's copy on the last stage) and Llama (4 layers, a tied head), with and without the KV cache,
// on pp=2, pp=4, pp=2 x dp=2 (prompts split over dp inside each stage) and pp=2 x tp=2; a cp dim
// replicates (cp=2, dp=2 x cp=2, cp=2 x tp=2, pp=2 x cp=2 give one rank's tokens too).
#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "shardwise/generate/generate.h"
#include "tests/support/generate_on.h"
#include "tests/support/llama_config.h"
#include "tests/support/pipeline_config.h"

namespace shardwise::train {
namespace {

struct Model {
  GptConfig config;
  std::map<std::string, Tensor> weights;  // whole tensors
};

// A few steps of `c` on one rank (weights that are not the initial ones), gathered whole.
Model trained(TrainConfig c) {
  Model m;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) t.step();
    m.config = t.config().model;
    for (const ParamState& p : t.params()) m.weights[p.name] = t.gather_param(p.name);
  });
  return m;
}

const Model& gpt() {
  static const Model m = trained(pipeline_test_config("dp=1", "1f1b", 4));
  return m;
}

const Model& llama() {
  static const Model m = [] {
    TrainConfig c = llama_test_config("dp=1", 20);
    c.model.layers = 4, c.model.tie_word_embeddings = true;
    return trained(c);
  }();
  return m;
}

GenerateResult generate_on(const Model& m, const std::string& mesh, const GenerateConfig& config) {
  const std::vector<std::vector<int64_t>> prompts = {{'1', '2', '+'}, {'4', '5', '+', '3', '3', '='}, {'7'}};
  return generate_with_weights(m.config, m.weights, mesh, prompts, config);
}

void expect_same_as_one_rank(const Model& m, const std::string& what,
                             const std::vector<std::string>& meshes = {"pp=2", "pp=4", "pp=2,dp=2", "pp=2,tp=2"}) {
  for (bool cache : {true, false}) {
    GenerateConfig config;
    config.max_new_tokens = 5;
    config.keep_logits = true;
    config.kv_cache = cache;
    const GenerateResult one = generate_on(m, "dp=1", config);
    for (const std::string& mesh : meshes) {
      const std::string where = what + " on " + mesh + (cache ? "" : " without the cache");
      const GenerateResult got = generate_on(m, mesh, config);
      ASSERT_EQ(got.sequences.size(), one.sequences.size()) << where;
      for (size_t i = 0; i < one.sequences.size(); ++i) {
        EXPECT_EQ(got.sequences[i].tokens, one.sequences[i].tokens) << where << ", prompt " << i;
        ASSERT_EQ(got.sequences[i].logits.size(), one.sequences[i].logits.size()) << where;
        for (size_t k = 0; k < one.sequences[i].logits.size(); ++k)
          for (size_t v = 0; v < one.sequences[i].logits[k].size(); ++v)
            ASSERT_NEAR(got.sequences[i].logits[k][v], one.sequences[i].logits[k][v], 1e-5)
                << where << ", prompt " << i << ", token " << k << ", id " << v;
      }
    }
  }
}

TEST(GeneratePipeline, Gpt2OnPpMeshesGivesOneRanksTokens) { expect_same_as_one_rank(gpt(), "GPT-2"); }

TEST(GeneratePipeline, LlamaOnPpMeshesGivesOneRanksTokens) { expect_same_as_one_rank(llama(), "Llama"); }

TEST(GeneratePipeline, FewerLayersThanStagesAreRefused) {
  Model m = gpt();
  m.config.layers = 1;
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    EXPECT_THROW(Generator(m.config, Strategy::from_mesh(mesh::parse_mesh("pp=2"), false), w.group(w.members()),
                           whole_weights(m.weights, w.members()[static_cast<size_t>(w.rank())])),
                 Error);
  });
}

// A cp dim replicates in generation (every cp rank runs the whole sequences): on cp=2, dp=2 x cp=2,
// cp=2 x tp=2 and pp=2 x cp=2 the tokens and kept logits are one rank's.
TEST(GeneratePipeline, CpMeshesGiveOneRanksTokens) {
  const std::vector<std::string> meshes = {"cp=2", "dp=2,cp=2", "cp=2,tp=2", "pp=2,cp=2"};
  expect_same_as_one_rank(gpt(), "GPT-2", meshes);
  expect_same_as_one_rank(llama(), "Llama", meshes);
}

}  // namespace
}  // namespace shardwise::train
