// Generation with a KV cache against an independent reference: the evaluation graph of build_gpt
// (training = false: the argmax of a full forward at every position), run teacher-forced over the
// prompt and the generated tokens. A greedy token is right iff it is that argmax at the position
// before it. The model is the trainer tests' small GPT after a short run on 2-digit addition (so
// its outputs are digits and newlines, not a flat distribution), weights gathered in-process.
#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/generate/generate.h"
#include "shardwise/models/gpt_decode.h"
#include "shardwise/models/models.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

std::vector<int64_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

struct Model {
  TrainConfig config;
  std::map<std::string, Tensor> weights;  // whole tensors
};

// 200 steps of the small configuration (a fraction of a second).
const Model& trained() {
  static const Model model = [] {
    Model m;
    m.config = small_config("dp=1", 200);
    comm::LocalWorld::run(1, [&](comm::Communicator& w) {
      Trainer t(m.config, w.group(w.members()));
      for (int64_t s = 0; s < m.config.optimizer.steps; ++s) t.step();
      m.config = t.config();  // the derived sequence length
      for (const ParamState& p : t.params()) m.weights[p.name] = t.gather_param(p.name);
    });
    return m;
  }();
  return model;
}

const GptConfig& model() { return trained().config.model; }

// generate() on `ranks` threads with `mesh`; every rank must return the same tokens.
GenerateResult generate_on(const std::string& mesh, int ranks, const std::vector<std::vector<int64_t>>& prompts,
                           const GenerateConfig& config) {
  std::vector<GenerateResult> results(static_cast<size_t>(ranks));
  comm::LocalWorld::run(ranks, [&](comm::Communicator& w) {
    auto world = w.group(w.members());
    Generator gen(model(), Strategy::from_mesh(mesh::parse_mesh(mesh), false), world,
                  whole_weights(trained().weights, world->members()[static_cast<size_t>(world->rank())]));
    results[static_cast<size_t>(w.rank())] = gen.generate(prompts, config);
  });
  for (int r = 1; r < ranks; ++r) {
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(results[static_cast<size_t>(r)].sequences[i].tokens, results[0].sequences[i].tokens)
          << mesh << ": rank " << r << ", prompt " << i;
  }
  return results[0];
}

// The reference: build_gpt's greedy predictions [1, seq] over `tokens` (the first seq of them,
// padded with 0), on one rank.
std::vector<int64_t> teacher_forced_argmax(const std::vector<int64_t>& tokens) {
  const GptConfig& c = model();
  std::vector<int64_t> out;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Strategy s = Strategy::from_mesh(mesh::parse_mesh("dp=1"), false);
    GptGraph gpt = build_gpt(c, s, 1, false);
    graph::Program p = graph::lower(gpt.g, graph::complete(gpt.g, s.mesh));
    runtime::Runtime rt(gpt.g, p, w.group(w.members()));
    for (const auto& [name, t] : trained().weights) rt.set_global(name, t);
    Tensor ids(DType::I64, Shape{1, c.seq});
    for (int64_t i = 0; i < c.seq && i < static_cast<int64_t>(tokens.size()); ++i)
      ids.data<int64_t>()[i] = tokens[static_cast<size_t>(i)];
    rt.set_global("ids", ids);
    for (const auto& [name, t] : model_constants(c)) rt.set_global(name, t);  // none with fused attention
    rt.run();
    Tensor pred = rt.gather(gpt.g.value(gpt.predictions).name);
    out.assign(pred.data<int64_t>(), pred.data<int64_t>() + c.seq);
  });
  return out;
}

void expect_teacher_forced(const std::vector<int64_t>& prompt, const GeneratedSequence& s, const std::string& what) {
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), s.tokens.begin(), s.tokens.end());
  std::vector<int64_t> want = teacher_forced_argmax(all);
  ASSERT_FALSE(s.tokens.empty()) << what;
  for (size_t t = 0; t < s.tokens.size(); ++t)
    EXPECT_EQ(s.tokens[t], want[prompt.size() - 1 + t]) << what << ": new token " << t;
}

std::vector<std::vector<int64_t>> addition_prompts() {
  return {bytes("12+34="), bytes("7+58="), bytes("99+99="), bytes("3+4=")};
}

GenerateConfig greedy(int64_t max_new, int64_t eos = -1) {
  GenerateConfig g;
  g.max_new_tokens = max_new;
  g.eos_id = eos;
  return g;
}

GenerateConfig sampled() {
  GenerateConfig g = greedy(6);
  g.sampling.temperature = 0.9, g.sampling.top_k = 20, g.sampling.top_p = 0.95, g.sampling.seed = 7;
  return g;
}

TEST(Generate, GreedyWithKvCacheIsTheTeacherForcedArgmax) {
  auto prompts = addition_prompts();
  // Up to the model's positions (seq + 1 tokens: the last one predicted from the last position).
  GenerateResult r = generate_on("dp=1", 1, prompts, greedy(100));
  ASSERT_EQ(r.sequences.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& s = r.sequences[i];
    EXPECT_EQ(static_cast<int64_t>(prompts[i].size() + s.tokens.size()), model().seq + 1) << "prompt " << i;
    EXPECT_EQ(s.stop, StopReason::MaxPositions);
    expect_teacher_forced(prompts[i], s, "prompt " + std::to_string(i));
  }
  EXPECT_EQ(r.stats.new_tokens, r.stats.decode_tokens + static_cast<int64_t>(prompts.size()));
}

TEST(Generate, EveryMeshGivesTheSameTokensGreedyAndSampled) {
  auto prompts = addition_prompts();
  prompts.pop_back();  // 3 prompts: dp=2 pads the batch
  for (const GenerateConfig& config : {greedy(5), sampled()}) {
    GenerateResult ref = generate_on("dp=1", 1, prompts, config);
    for (auto [mesh, ranks] : std::vector<std::pair<std::string, int>>{{"tp=2", 2}, {"dp=2", 2}, {"dp=2,tp=2", 4}}) {
      GenerateResult got = generate_on(mesh, ranks, prompts, config);
      ASSERT_EQ(got.sequences.size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(got.sequences[i].tokens, ref.sequences[i].tokens)
            << mesh << (config.sampling.greedy() ? " greedy" : " sampled") << ": prompt " << i;
    }
  }
}

TEST(Generate, RecomputingThePrefixGivesTheCachedTokens) {
  auto prompts = addition_prompts();
  for (GenerateConfig config : {greedy(5), sampled()}) {
    GenerateResult cached = generate_on("dp=1", 1, prompts, config);
    config.kv_cache = false;
    GenerateResult recomputed = generate_on("tp=2", 2, prompts, config);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(recomputed.sequences[i].tokens, cached.sequences[i].tokens) << "prompt " << i;
      EXPECT_EQ(recomputed.sequences[i].stop, cached.sequences[i].stop) << "prompt " << i;
    }
  }
}

TEST(Generate, ABatchOfDifferentLengthsGivesEachPromptsOwnTokens) {
  auto prompts = addition_prompts();
  GenerateConfig config = greedy(6, '\n');
  GenerateResult batch = generate_on("dp=1", 1, prompts, config);
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateResult alone = generate_on("dp=1", 1, {prompts[i]}, config);
    EXPECT_EQ(batch.sequences[i].tokens, alone.sequences[0].tokens) << "prompt " << i;
    EXPECT_EQ(batch.sequences[i].stop, alone.sequences[0].stop) << "prompt " << i;
  }
}

TEST(Generate, StopsAtEosAndAtMaxNewTokens) {
  // The answer the model gives, then stop at the newline after it (kept in the output).
  auto prompt = bytes("12+34=");
  GenerateResult free = generate_on("dp=1", 1, {prompt}, greedy(3));
  ASSERT_EQ(free.sequences[0].tokens.size(), 3u);
  EXPECT_EQ(free.sequences[0].stop, StopReason::MaxNewTokens);
  const int64_t eos = free.sequences[0].tokens[1];  // pretend the second token ends a sequence
  GenerateResult stopped = generate_on("dp=1", 1, {prompt}, greedy(3, eos));
  const auto& s = stopped.sequences[0];
  EXPECT_EQ(s.stop, StopReason::Eos);
  ASSERT_GE(s.tokens.size(), 1u);
  EXPECT_EQ(s.tokens.back(), eos);
  EXPECT_LE(s.tokens.size(), 2u);
}

TEST(Generate, BadPromptsAndSettingsAreRefusedByName) {
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected an Error with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const GptConfig& c = model();
  expect_error([&] { check_prompts({bytes("1+1="), {}}, c); }, "prompt 1 is empty");
  expect_error([&] { check_prompts({std::vector<int64_t>(static_cast<size_t>(c.seq + 1), 49)}, c); },
               fmt::format("prompt 0 has {} tokens; the model holds at most {} positions", c.seq + 1, c.seq));
  expect_error([&] { check_prompts({{1, 2, 128}}, c); }, "token 128 at position 2 is outside the vocabulary [0, 128)");
  for (double p : {0.0, 1.5}) {
    GenerateConfig g;
    g.sampling.top_p = p;
    expect_error([&] { g.validate(c); }, "--top-p must be in (0, 1]");
  }
  GenerateConfig g;
  g.max_new_tokens = 0;
  expect_error([&] { g.validate(c); }, "--max-new-tokens must be at least 1");
  expect_error([&] { build_gpt_decode_step(c, Strategy::from_mesh(mesh::parse_mesh("pp=2"), false), 2, 4); },
               "has a pp dim");
}

}  // namespace
}  // namespace shardwise::train
