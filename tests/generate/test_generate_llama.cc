// Llama generation (llama_decode.h through Generator) against independent references, as
// test_generate.cc proves GPT-2's: the evaluation graph of build_llama (training = false: the argmax
// of a full forward at every position, positions one [S] row) run teacher-forced over the prompt
// and the generated tokens, on one rank, tp=2 and dp=2 x tp=2, with grouped-query attention (4
// heads over 2 kv heads: the cache sharded by kv heads) and with 1 kv head on tp=2 (the cache
// replicated over tp); prompts of different lengths, so each decode step rotates each sequence by
// its own position. And transformers: tests/golden/hf/llama_tiny (a LlamaForCausalLM written by
// tools/hf_parity.py) gives its logits at the last position within 1e-5 and its greedy tokens, as
// does tests/golden/hf/mixtral_tiny (a MixtralForCausalLM written by tools/hf_mixtral.py: the MoE MLP).
#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/generate_on.h"
#include "tests/support/hf_generation.h"
#include "tests/support/llama_config.h"
#include "shardwise/comm/local.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/generate/generate.h"
#include "shardwise/models/llama_decode.h"
#include "shardwise/models/model_io.h"
#include "shardwise/models/models.h"

namespace shardwise::train {
namespace {

std::vector<int64_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

struct Model {
  TrainConfig config;
  std::map<std::string, Tensor> weights;  // whole tensors
};

// 150 steps of the Llama tests' configuration on 2-digit addition, with `kv_heads` kv heads (and
// the head tied when `tied`), weights gathered in-process.
Model train_llama(int64_t kv_heads, bool tied) {
  Model m;
  m.config = llama_test_config("dp=1", 150);
  m.config.model.kv_heads = kv_heads;
  m.config.model.tie_word_embeddings = tied;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Trainer t(m.config, w.group(w.members()));
    for (int64_t s = 0; s < m.config.optimizer.steps; ++s) t.step();
    m.config = t.config();
    for (const ParamState& p : t.params()) m.weights[p.name] = t.gather_param(p.name);
  });
  return m;
}

const Model& gqa() {  // 4 heads over 2 kv heads, untied head
  static const Model m = train_llama(2, false);
  return m;
}

const Model& one_kv_head() {  // 1 kv head (replicated over tp=2), tied head
  static const Model m = train_llama(1, true);
  return m;
}

GenerateResult generate_on(const Model& m, const std::string& mesh, const std::vector<std::vector<int64_t>>& prompts,
                           const GenerateConfig& config) {
  return generate_with_weights(m.config.model, m.weights, mesh, prompts, config);
}

// build_llama's greedy predictions [1, seq] over `tokens` (padded with 0), on one rank.
std::vector<int64_t> teacher_forced_argmax(const Model& m, const std::vector<int64_t>& tokens) {
  const GptConfig& c = m.config.model;
  std::vector<int64_t> out;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Strategy s = Strategy::from_mesh(mesh::parse_mesh("dp=1"), false);
    GptGraph model = build_model(c, s, 1, false);
    graph::Program p = graph::lower(model.g, graph::complete(model.g, s.mesh));
    runtime::Runtime rt(model.g, p, w.group(w.members()));
    for (const auto& [name, t] : m.weights) rt.set_global(name, t);
    for (const auto& [name, t] : model_constants(c)) rt.set_global(name, t);
    Tensor ids(DType::I64, Shape{1, c.seq});
    for (int64_t i = 0; i < c.seq && i < static_cast<int64_t>(tokens.size()); ++i)
      ids.data<int64_t>()[i] = tokens[static_cast<size_t>(i)];
    rt.set_global("ids", ids);
    rt.run();
    Tensor pred = rt.gather(model.g.value(model.predictions).name);
    out.assign(pred.data<int64_t>(), pred.data<int64_t>() + c.seq);
  });
  return out;
}

void expect_teacher_forced(const Model& m, const std::vector<int64_t>& prompt, const GeneratedSequence& s,
                           const std::string& what) {
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), s.tokens.begin(), s.tokens.end());
  std::vector<int64_t> want = teacher_forced_argmax(m, all);
  ASSERT_FALSE(s.tokens.empty()) << what;
  for (size_t t = 0; t < s.tokens.size(); ++t)
    EXPECT_EQ(s.tokens[t], want[prompt.size() - 1 + t]) << what << ": new token " << t;
}

std::vector<std::vector<int64_t>> addition_prompts() {
  return {bytes("12+34="), bytes("7+58="), bytes("99+99="), bytes("3+4=")};
}

GenerateConfig greedy(int64_t max_new) {
  GenerateConfig g;
  g.max_new_tokens = max_new;
  return g;
}

// Up to the model's positions, every token the teacher-forced argmax, on every mesh.
TEST(GenerateLlama, GreedyWithKvCacheIsTheTeacherForcedArgmaxOnEveryMesh) {
  auto prompts = addition_prompts();
  for (auto [model, mesh] : std::vector<std::pair<const Model*, std::string>>{
           {&gqa(), "dp=1"}, {&gqa(), "tp=2"}, {&gqa(), "dp=2,tp=2"}, {&one_kv_head(), "tp=2"},
           {&one_kv_head(), "dp=2,tp=2"}}) {
    const std::string what = fmt::format("{} kv heads on {}", model->config.model.key_value_heads(), mesh);
    GenerateResult r = generate_on(*model, mesh, prompts, greedy(100));
    ASSERT_EQ(r.sequences.size(), prompts.size()) << what;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& s = r.sequences[i];
      EXPECT_EQ(static_cast<int64_t>(prompts[i].size() + s.tokens.size()), model->config.model.seq + 1) << what;
      EXPECT_EQ(s.stop, StopReason::MaxPositions) << what;
      expect_teacher_forced(*model, prompts[i], s, what + ", prompt " + std::to_string(i));
    }
  }
}

TEST(GenerateLlama, RecomputingThePrefixGivesTheCachedTokens) {
  auto prompts = addition_prompts();
  for (const Model* model : {&gqa(), &one_kv_head()}) {
    GenerateConfig config = greedy(5);
    config.sampling.temperature = 0.9, config.sampling.top_k = 20, config.sampling.seed = 3;
    for (double temperature : {0.0, 0.9}) {
      config.sampling.temperature = temperature;
      config.kv_cache = true;
      GenerateResult cached = generate_on(*model, "dp=1", prompts, config);
      config.kv_cache = false;
      GenerateResult recomputed = generate_on(*model, "tp=2", prompts, config);
      for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(recomputed.sequences[i].tokens, cached.sequences[i].tokens)
            << model->config.model.key_value_heads() << " kv heads, temperature " << temperature << ", prompt " << i;
    }
  }
}

// The cache holds kv heads: [B, kv_heads, C, head_dim], sharded by kv heads over tp when tp
// divides them, else replicated.
TEST(GenerateLlama, TheCacheHoldsKvHeadsShardedOrReplicatedOverTp) {
  for (auto [kv, want] : std::vector<std::pair<int64_t, std::string>>{{2, "S(0),S(1)"}, {1, "S(0),R"}}) {
    GptConfig c = gqa().config.model;
    c.kv_heads = kv;
    Strategy s = Strategy::from_mesh(mesh::parse_mesh("dp=2,tp=2"), false);
    DecoderGraph d = build_model_decode_step(c, s, 2, 6);
    graph::Program p = graph::lower(d.g, graph::complete(d.g, s.mesh));
    for (const std::string& name : {d.past_k[0], d.past_v[1], d.present_k[1]}) {
      const graph::ValueId v = d.g.get(name);
      EXPECT_EQ(d.g.value(v).meta.shape[1], kv) << name;
      EXPECT_EQ(p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])].dist.to_string(), want) << name;
    }
    // The training forward's collectives only: all-reduces over tp after the vocab-parallel
    // embedding and each layer's o and down projections (a replicated cache is sliced locally
    // for each rank's q heads; the rotation by sequence moves nothing).
    const std::vector<std::pair<std::string, int>> counts = p.collective_counts();
    EXPECT_EQ(counts, (std::vector<std::pair<std::string, int>>{{"all_reduce", static_cast<int>(1 + 2 * c.layers)}}))
        << kv << " kv heads:\n" << p.to_string(d.g);
  }
}

TEST(GenerateLlama, TransformersLogitsAndGreedyTokens) {
  // transformers' greedy generate stops at its config's eos, 127. On pp=2 each stage reads its own
  // layers from the checkpoint.
  expect_transformers_logits_and_greedy("llama_tiny", {"dp=1", "tp=2", "dp=2,tp=2", "pp=2", "pp=2,tp=2"}, 127);
}

// A Mixtral (tools/hf_mixtral.py's MixtralForCausalLM: 4 experts, top-2, in both layers): the
// decode graphs' MoE MLPs give transformers' logits and greedy tokens (so each mesh gives one
// rank's); on ep=2, dp=2 x ep=2, ep=2 x tp=2 and pp=2 x ep=2 the prompts are split over the data
// dims (one prompt padded) and the experts over ep.
TEST(GenerateLlama, MixtralTransformersLogitsAndGreedyTokens) {
  expect_transformers_logits_and_greedy("mixtral_tiny",
                                        {"dp=1", "tp=2", "dp=2,tp=2", "ep=2", "dp=2,ep=2", "ep=2,tp=2", "pp=2,ep=2"}, 127);
}

// On an ep mesh the prefill and decode graphs hold each MoE layer's experts split over ep (E / ep per
// rank, as training), not replicated; the router's gate stays whole.
TEST(GenerateLlama, MixtralExpertsAreShardedOverEp) {
  const GptConfig c = read_model_config(kHfGoldenDir + "/mixtral_tiny");
  ASSERT_GT(c.experts, 0);
  for (const std::string mesh : {"ep=2", "dp=2,ep=2", "ep=2,tp=2"}) {
    Strategy s = Strategy::from_mesh(mesh::parse_mesh(mesh), false);
    for (bool decode : {false, true}) {
      DecoderGraph d = decode ? build_model_decode_step(c, s, 4, 6) : build_model_prefill(c, s, 4, 6);
      graph::Program p = graph::lower(d.g, graph::complete(d.g, s.mesh));
      auto dist = [&](const std::string& name) {
        const graph::ValueId v = d.g.get(name);
        return p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(v)])].dist;
      };
      for (const char* part : {"w1", "w2", "w3"}) {
        const std::string name = fmt::format("model.layers.1.block_sparse_moe.experts.{}", part);
        EXPECT_EQ(dist(name).to_string(), expert_placements(s)) << mesh << " " << name;
        EXPECT_EQ(mesh::local_block(d.g.value(d.g.get(name)).meta.shape, dist(name), s.mesh, s.mesh.coords(0)).shape[0],
                  c.experts / 2)
            << mesh << " " << name;
      }
      EXPECT_EQ(dist("model.layers.0.block_sparse_moe.gate.weight").to_string().find("S"), std::string::npos) << mesh;
    }
  }
  EXPECT_EQ(expert_placements(Strategy::from_mesh(mesh::parse_mesh("dp=2,ep=2,tp=2"), false)), "R,S(0),R");
}

// A Qwen2 (tools/hf_families.py's Qwen2ForCausalLM: random q/k/v biases, rope_theta 1e6): the decode
// graphs add the biases (sharded with the rows of q/k/v on tp) and give transformers' tokens.
TEST(GenerateLlama, Qwen2TransformersLogitsAndGreedyTokens) {
  expect_transformers_logits_and_greedy("qwen2_tiny", {"dp=1", "tp=2", "dp=2,tp=2"}, 127);
}

// A Qwen3 (tools/hf_families.py's Qwen3ForCausalLM: random q/k norm weights, one kv head, a tied head):
// the decode graphs normalise each q and k head before rotary, as transformers does.
TEST(GenerateLlama, Qwen3TransformersLogitsAndGreedyTokens) {
  expect_transformers_logits_and_greedy("qwen3_tiny", {"dp=1", "tp=2", "dp=2,tp=2"}, 127);
}

// A Qwen3 whose head_dim 16 is not hidden / heads (48 / 4; tools/hf_families.py's qwen3_hd): the
// prefill and decode graphs project to heads x head_dim and back, the cache [B, kv, C, 16].
TEST(GenerateLlama, Qwen3WithHeadDimTransformersLogitsAndGreedyTokens) {
  expect_transformers_logits_and_greedy("qwen3_hd_tiny", {"dp=1", "tp=2", "dp=2,tp=2"}, 127);
}

// A Mistral (tools/hf_families.py's MistralForCausalLM, sliding_window null): Llama's decode graphs.
TEST(GenerateLlama, MistralTransformersLogitsAndGreedyTokens) {
  expect_transformers_logits_and_greedy("mistral_tiny", {"dp=1", "tp=2", "dp=2,tp=2"}, 127);
}

}  // namespace
}  // namespace shardwise::train
