// The Llama model (models/llama.h): its parameters are transformers' LlamaForCausalLM names and
// layouts, tensor parallelism lays them out as documented (k/v sharded by kv heads when tp divides
// them, else replicated), and 20 training steps follow the single-rank loss curve on every mesh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "tests/support/llama_config.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/graph/program.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/models/llama.h"
#include "shardwise/models/models.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

struct Curve {
  std::vector<double> losses, norms;
};

Curve train(TrainConfig c) {
  Curve out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& world) {
    Trainer t(c, world.group(world.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      StepResult r = t.step();
      if (world.rank() == 0) out.losses.push_back(r.loss), out.norms.push_back(r.grad_norm);
    }
  });
  return out;
}

void expect_same_curve(const Curve& got, const Curve& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << ": step " << i + 1;
    EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-5 * std::abs(ref.norms[i])) << what << ": gradient norm, step " << i + 1;
  }
}

TEST(Llama, GqaUntiedCurvesOnEveryMeshFollowTheSingleRankCurve) {
  const Curve ref = train(llama_test_config("dp=1"));
  ASSERT_EQ(ref.losses.size(), 20u);
  EXPECT_LT(ref.losses.back(), ref.losses.front() * 0.8) << "the loss should fall";
  for (const char* mesh : {"dp=2", "tp=2", "dp=2,tp=2", "pp=2"}) {
    expect_same_curve(train(llama_test_config(mesh)), ref, mesh);
  }
  TrainConfig sp = llama_test_config("tp=2");
  sp.parallel.sequence_parallel = true;
  expect_same_curve(train(sp), ref, "tp=2 + sp");
}

// kv heads that tp does not divide are replicated over tp (multi-query: 1 kv head; 2 kv heads on
// tp=4), and a tied head crosses pipeline stages (both ends hold the embedding): each follows its
// own single-rank curve.
TEST(Llama, ReplicatedKvHeadsAndATiedHeadFollowTheSingleRankCurve) {
  TrainConfig mqa = llama_test_config("dp=1", 6);
  mqa.model.kv_heads = 1;
  const Curve mqa_ref = train(mqa);
  mqa.parallel.mesh = "tp=2";
  expect_same_curve(train(mqa), mqa_ref, "1 kv head on tp=2");
  TrainConfig kv2 = llama_test_config("dp=1", 6);
  const Curve kv2_ref = train(kv2);
  kv2.parallel.mesh = "tp=4";
  expect_same_curve(train(kv2), kv2_ref, "2 kv heads on tp=4");
  TrainConfig tied = llama_test_config("dp=1", 6);
  tied.model.tie_word_embeddings = true;
  const Curve tied_ref = train(tied);
  for (const char* mesh : {"pp=2", "tp=2,pp=2"}) {
    tied.parallel.mesh = mesh;
    expect_same_curve(train(tied), tied_ref, std::string("tied head on ") + mesh);
  }
}

// transformers' names and [out, in] layouts, no biases, and the tp layouts of the header comment.
TEST(Llama, ParametersAreTransformersNamesWithTheDocumentedTpLayouts) {
  auto layouts = [](TrainConfig c) {
    std::map<std::string, std::pair<Shape, std::string>> out;
    comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& world) {
      Trainer t(c, world.group(world.members()));
      if (world.rank() != 0) return;
      for (const ParamState& p : t.params()) out[p.name] = {p.shape, p.dist.to_string()};
    });
    return out;
  };
  auto p = layouts(llama_test_config("tp=2", 1));
  const std::map<std::string, std::pair<Shape, std::string>> layer0 = {
      {"model.layers.0.input_layernorm.weight", {Shape{32}, "R"}},
      {"model.layers.0.self_attn.q_proj.weight", {Shape{32, 32}, "S(0)"}},
      {"model.layers.0.self_attn.k_proj.weight", {Shape{16, 32}, "S(0)"}},
      {"model.layers.0.self_attn.v_proj.weight", {Shape{16, 32}, "S(0)"}},
      {"model.layers.0.self_attn.o_proj.weight", {Shape{32, 32}, "S(1)"}},
      {"model.layers.0.post_attention_layernorm.weight", {Shape{32}, "R"}},
      {"model.layers.0.mlp.gate_proj.weight", {Shape{64, 32}, "S(0)"}},
      {"model.layers.0.mlp.up_proj.weight", {Shape{64, 32}, "S(0)"}},
      {"model.layers.0.mlp.down_proj.weight", {Shape{32, 64}, "S(1)"}}};
  for (const auto& [name, want] : layer0) {
    ASSERT_TRUE(p.contains(name)) << name;
    EXPECT_EQ(p[name].first, want.first) << name;
    EXPECT_EQ(p[name].second, want.second) << name;
  }
  EXPECT_EQ(p["model.embed_tokens.weight"].second, "S(0)");
  EXPECT_EQ(p["lm_head.weight"].second, "S(0)");
  EXPECT_EQ(p["model.norm.weight"].first, Shape{32});
  EXPECT_EQ(p.size(), 2 * layer0.size() + 3);  // no biases, no position embedding
  TrainConfig mqa = llama_test_config("tp=2", 1);
  mqa.model.kv_heads = 1;
  auto q = layouts(mqa);
  EXPECT_EQ(q["model.layers.1.self_attn.k_proj.weight"].first, (Shape{8, 32}));
  EXPECT_EQ(q["model.layers.1.self_attn.k_proj.weight"].second, "R");  // replicated over tp
  EXPECT_EQ(q["model.layers.1.self_attn.q_proj.weight"].second, "S(0)");
  TrainConfig tied = llama_test_config("dp=1", 1);
  tied.model.tie_word_embeddings = true;
  EXPECT_FALSE(layouts(tied).contains("lm_head.weight"));
}

TEST(Llama, ConfigurationsItCannotBuildAreRefusedNamingTheField) {
  auto message = [](TrainConfig c) {
    try {
      c.check(1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig c = llama_test_config("dp=1");
  c.model.kv_heads = 3;
  EXPECT_NE(message(c).find("3 key/value heads must divide the 4 attention heads"), std::string::npos) << message(c);
  c = llama_test_config("dp=1");
  c.model.hidden = 12;  // head dim 3
  EXPECT_NE(message(c).find("head dim 3 (head_dim, or hidden 12 / 4 heads) must be even"), std::string::npos) << message(c);
  c = llama_test_config("dp=1");
  c.model.model_type = "mistral";
  EXPECT_NE(message(c).find("model 'mistral' is not one shardwise builds (gpt2, llama)"), std::string::npos);
}

// GPT-2's LoRA is not built for Llama: refused naming the combination (and the same GPT-2
// configuration passes).
// Validation runs forward-only stages that bind Llama's constants (the causal mask and the
// rotary positions) beside the per-micro-batch feeds: the same loss on every mesh.
TEST(Llama, ValidationLossIsTheSameOnEveryMesh) {
  const std::filesystem::path data = std::filesystem::temp_directory_path() / "shardwise-llama-val.bin";
  {
    std::ofstream out(data, std::ios::binary | std::ios::trunc);
    uint32_t t = 1;
    for (uint32_t i = 0; i < 4000; ++i) {
      t = (t * 5 + 3 + (i % 11 == 0 ? i % 7 : 0)) % 128;
      out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
    }
  }
  auto losses = [&](const std::string& mesh) {
    TrainConfig c = llama_test_config(mesh, 2);
    c.data.files = data.string(), c.data.val_fraction = 0.25, c.data.val_samples = 6;
    std::vector<double> out;
    comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(mesh).size()), [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      std::vector<double> mine = {t.validate().loss};
      t.step();
      mine.push_back(t.validate().loss);
      if (w.rank() == 0) out = mine;
    });
    return out;
  };
  const std::vector<double> ref = losses("dp=1");
  ASSERT_EQ(ref.size(), 2u);
  for (const std::string mesh : {"tp=2", "pp=2", "dp=2"}) {
    const std::vector<double> got = losses(mesh);
    ASSERT_EQ(got.size(), 2u) << mesh;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * ref[i]) << mesh << ", validation " << i;
  }
  std::filesystem::remove(data);
}


// Mixtral-style MoE MLPs (4 experts, top-2, aux and z losses) in every layer or in layer 1 only:
// 20 steps on ep=2 (experts and, at the MoE layers, tokens split 2 ways), dp=2 x ep=2,
// tp=2 x ep=2, ep=4 (one expert a rank) and pp=2 x ep=2 (the first stage's router losses reach
// the loss as its extra loss) follow the single-rank curve; capacity mode too where it drops
// assignments.
TrainConfig moe_config(const std::string& mesh, int64_t steps = 20) {
  TrainConfig c = llama_test_config(mesh, steps);
  c.model.experts = 4, c.model.top_k = 2, c.model.aux_loss = 0.01, c.model.router_z_loss = 0.001;
  return c;
}

TEST(Llama, MoeCurvesOnEpMeshesFollowTheSingleRankCurve) {
  const Curve ref = train(moe_config("dp=1"));
  ASSERT_EQ(ref.losses.size(), 20u);
  EXPECT_LT(ref.losses.back(), ref.losses.front() * 0.8) << "the loss should fall";
  const Curve dense = train(llama_test_config("dp=1"));
  EXPECT_NE(dense.losses[1], ref.losses[1]) << "the MoE model must differ from the dense one";
  for (const char* mesh : {"ep=2", "dp=2,ep=2", "ep=2,dp=2", "ep=2,tp=2", "ep=4", "pp=2,ep=2"}) {
    expect_same_curve(train(moe_config(mesh)), ref, mesh);
  }
  TrainConfig one_layer = moe_config("dp=1");
  one_layer.model.moe_layers = {1};
  one_layer.model.capacity_factor = 0.75;
  const Curve one_ref = train(one_layer);
  one_layer.parallel.mesh = "dp=2,ep=2";
  expect_same_curve(train(one_layer), one_ref, "layer 1 only, capacity 0.75, dp=2,ep=2");
  TrainConfig sigmoid = moe_config("dp=1");  // --router sigmoid: its own curve, the same on ep meshes
  sigmoid.model.router = "sigmoid";
  const Curve sigmoid_ref = train(sigmoid);
  EXPECT_NE(sigmoid_ref.losses[0], ref.losses[0]) << "sigmoid gating must weigh the experts otherwise";
  sigmoid.parallel.mesh = "dp=2,ep=2";
  expect_same_curve(train(sigmoid), sigmoid_ref, "sigmoid router, dp=2,ep=2");
  TrainConfig shared = moe_config("dp=1");  // a Qwen-MoE shared expert (width 32, gated) in every layer
  shared.model.shared_expert_width = 32;
  const Curve shared_ref = train(shared);
  EXPECT_NE(shared_ref.losses[0], ref.losses[0]) << "the shared expert must change the output";
  for (const char* mesh : {"dp=2,ep=2", "ep=2,tp=2"}) {
    shared.parallel.mesh = mesh;
    expect_same_curve(train(shared), shared_ref, std::string("shared expert, ") + mesh);
  }
}

// ep is a data dim: on dp=2 x ep=2 the global batch of 8 in 2 micro-batches is 1 sequence per
// rank and micro-batch, so the dense layers are 4-way data parallel. The sharded optimizer (stages
// 1 and 2, both layouts), the gradient buckets and stage 3 shard each parameter over its data
// group (dense ones over dp x ep, their gradients left summed over ep by the graph; the experts',
// S(0) on ep, over dp): each follows the single-rank curve.
TEST(Llama, MoeOnDpTimesEpWithShardingOrBucketsFollowsTheSingleRankCurve) {
  const Curve ref = train(moe_config("dp=1"));
  TrainConfig c = moe_config("dp=2,ep=2");
  c.check(4, false);
  EXPECT_EQ(c.optimizer.micro_batch, 1) << "8 sequences = micro-batch x 2 micro-batches x dp 2 x ep 2";
  for (const auto& [stage, layout] : {std::pair{1, "v1"}, {1, "v2"}, {2, "v1"}, {2, "v2"}, {3, "v1"}}) {
    TrainConfig s = moe_config("dp=2,ep=2");
    s.parallel.sharding.stage = stage, s.parallel.sharding.layout = layout;
    expect_same_curve(train(s), ref, fmt::format("dp=2,ep=2 sharding stage {} {}", stage, layout));
  }
  TrainConfig buckets = moe_config("dp=2,ep=2");
  buckets.parallel.overlap_grad_reduce = "on";
  expect_same_curve(train(buckets), ref, "dp=2,ep=2 --overlap-grad-reduce on");
}

// The lowered training program of the MoE Llama on dp=2 x ep=2: the ids are split over both data
// dims (a quarter of the batch a rank), and the only collectives outside the op's kernel are the
// gradients' all-reduces (no all-gather of the MoE output, no slice of its input).
TEST(Llama, MoeOnDpTimesEpSplitsTheBatchFourWaysAndReshardsOnlyGradients) {
  TrainConfig c = moe_config("dp=2,ep=2");
  c.check(4, false);
  const Strategy s = Strategy::from_mesh(mesh::parse_mesh(c.parallel.mesh), false);
  GptGraph gpt = build_model(kernel_model(c), s, c.optimizer.micro_batch * s.data_size());
  graph::append_backward(gpt.g, gpt.loss);
  graph::Program p = graph::lower(gpt.g, graph::complete(gpt.g, s.mesh));
  const graph::Slot& ids = p.slots[static_cast<size_t>(p.value_slot[static_cast<size_t>(gpt.g.get("ids"))])];
  EXPECT_EQ(ids.dist.to_string(), "S(0),S(0)");
  EXPECT_EQ(mesh::local_shape(ids.meta.shape, ids.dist, s.mesh, s.mesh.coords(3)), (Shape{1, c.model.seq}));
  for (const auto& [kind, count] : p.collective_counts()) EXPECT_EQ(kind, "all_reduce") << count << "\n" << p.to_string(gpt.g);
  // Sharding stage 2 takes every gradient's reduction (dense ones over dp x ep, the experts' over
  // dp): of stage 0's all-reduces (one per data dim of each gradient: 17 dense x 2 + 6 experts, and
  // two that are no parameter's gradient) only those two are left, and the gradients stay P(sum) on
  // their data dims.
  for (int stage : {0, 2}) {
    c.parallel.sharding = {stage, "v2"};
    comm::LocalWorld::run(4, [&](comm::Communicator& w) {
      Trainer t(c, w.group(w.members()));
      const graph::Program& staged = t.stages().runner().compiled(0).program;
      const std::vector<std::pair<std::string, int>> all_reduces = {{"all_reduce", stage == 0 ? 2 + 17 * 2 + 6 : 2}};
      EXPECT_EQ(staged.collective_counts(), all_reduces) << "stage " << stage;
      std::map<std::string, int> grads;  // gradient layouts (dp, ep) -> how many
      for (int slot : staged.param_grad_slot) ++grads[staged.slots[static_cast<size_t>(slot)].dist.to_string()];
      const std::map<std::string, int> partial = {{"P(sum),P(sum)", 17}, {"P(sum),S(0)", 6}};
      const std::map<std::string, int> reduced = {{"R,R", 17}, {"R,S(0)", 6}};
      EXPECT_EQ(grads, stage == 2 ? partial : reduced) << "stage " << stage;
    });
  }
}

TEST(Llama, MoeConfigurationsItCannotBuildAreRefused) {
  auto message = [](const TrainConfig& c, const char* mesh) {
    try {
      build_model(c.model, Strategy::from_mesh(mesh::parse_mesh(mesh), false), 8);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig c = moe_config("dp=1");
  EXPECT_EQ(message(c, "ep=2"), "no error");
  c.model.experts = 3;
  c.model.top_k = 1;
  EXPECT_NE(message(c, "ep=2").find("3 experts do not divide over ep=2"), std::string::npos) << message(c, "ep=2");
  c.model.top_k = 4;
  EXPECT_NE(message(c, "dp=1").find("--top-k 4 must be in [1, --experts 3]"), std::string::npos);
  c = moe_config("dp=1");
  c.model.moe_layers = {2};
  EXPECT_NE(message(c, "dp=1").find("--moe-layers names layer 2"), std::string::npos) << message(c, "dp=1");
  EXPECT_NE(message(llama_test_config("dp=1"), "ep=2").find("has an ep dim but the model has no experts"),
            std::string::npos);
  EXPECT_EQ(message(moe_config("dp=1"), "pp=2,ep=2"), "no error");  // router losses with pp: StageSpec::extra_loss
}

// parameter_count and largest_parameter against the parameters the builder creates (summed from
// the one-rank graph): dense and tied Llama, MoE in every layer or in layer 1 only, with a shared
// expert, and GPT-2.
TEST(Llama, ParameterCountIsTheBuiltGraphsIncludingTheExperts) {
  auto built = [](const GptConfig& m) {
    GptGraph gpt = build_model(m, Strategy::from_mesh(mesh::parse_mesh("dp=1"), false), 1);
    std::pair<double, double> total_largest{0, 0};
    for (graph::ValueId v : gpt.g.params()) {
      const double n = static_cast<double>(gpt.g.value(v).meta.shape.numel());
      total_largest.first += n;
      total_largest.second = std::max(total_largest.second, n);
    }
    return total_largest;
  };
  GptConfig tied = llama_test_config("dp=1").model, one_layer = moe_config("dp=1").model;
  tied.tie_word_embeddings = true;
  one_layer.moe_layers = {1};
  GptConfig shared = moe_config("dp=1").model, gpt;
  shared.shared_expert_width = 32;
  gpt.layers = 2, gpt.hidden = 32, gpt.heads = 4, gpt.seq = 16, gpt.vocab = 64;
  const std::pair<const char*, GptConfig> models[] = {{"dense", llama_test_config("dp=1").model}, {"tied", tied},
                                                      {"moe", moe_config("dp=1").model},         {"moe layer 1", one_layer},
                                                      {"shared expert", shared},                 {"gpt2", gpt}};
  for (const auto& [what, m] : models) {
    const auto [total, largest] = built(m);
    EXPECT_EQ(parameter_count(m), total) << what;
    EXPECT_EQ(largest_parameter(m).second, largest) << what;
  }
  EXPECT_EQ(largest_parameter(moe_config("dp=1").model).first, "model.layers.0.block_sparse_moe.experts.w1 (4x64x32)");
  EXPECT_EQ(largest_parameter(one_layer).first, "model.layers.1.block_sparse_moe.experts.w1 (4x64x32)");
}

// The router statistics of the metrics on 1 rank equal an independent count: the whole model on
// one runtime, each MoE layer's input rows gathered, routed here in double (top-2 by logit, ties
// to the lower expert), counted per expert, capacity applied per micro-batch, the aux and z losses
// from their definitions. Tokens per expert and drops are the same on ep=2, dp=2 x ep=2 and ep=4.
std::vector<StepResult> steps_of(const TrainConfig& c) {
  std::vector<StepResult> out;
  comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(c.parallel.mesh).size()), [&](comm::Communicator& world) {
    Trainer t(c, world.group(world.members()));
    for (int64_t s = 0; s < c.optimizer.steps; ++s) {
      StepResult r = t.step();
      if (world.rank() == 0) out.push_back(r);
    }
  });
  return out;
}

struct RouterCount {
  std::vector<double> tokens;  // per expert
  int64_t dropped = 0;
  double aux = 0, z = 0;       // the mean over the micro-batches
};

// Step 1 (the initial parameters, samples [0, global_batch)) of layer `layer` of `c`'s model.
RouterCount count_step_one(TrainConfig c, int64_t layer) {
  c.check(1);
  const GptConfig model = kernel_model(c);
  const int64_t seqs = c.optimizer.global_batch / c.optimizer.accumulation, E = model.experts, K = model.top_k;
  const std::string rows = fmt::format("model.layers.{}.block_sparse_moe.tokens", layer);
  const std::string gate = fmt::format("model.layers.{}.block_sparse_moe.gate.weight", layer);
  RouterCount out;
  out.tokens.assign(static_cast<size_t>(E), 0.0);
  std::unique_ptr<Dataset> data = open_training_data(c);
  comm::LocalWorld::run(1, [&](comm::Communicator& world) {
    Strategy s = Strategy::from_mesh(mesh::parse_mesh("dp=1"), false);
    GptGraph gpt = build_model(model, s, seqs);
    graph::Program p = graph::lower(gpt.g, graph::complete(gpt.g, s.mesh));
    runtime::Runtime rt(gpt.g, p, world.group(world.members()));
    rt.keep(rows);
    Tensor w;
    for (graph::ValueId v : gpt.g.params()) {
      const auto& val = gpt.g.value(v);
      Tensor init = init_model_param(model, val.name, val.meta.shape, c.optimizer.seed);
      if (val.name == gate) w = init;
      rt.set_global(val.name, init);
    }
    for (const auto& [name, t] : model_constants(model)) rt.set_global(name, t);
    for (int64_t mb = 0; mb < c.optimizer.accumulation; ++mb) {
      Batch b = make_batch(*data, mb * seqs, seqs, model.seq);
      rt.set_global("ids", b.ids);
      rt.set_global("labels", b.labels);
      rt.run();
      Tensor x = rt.gather(rows);
      const int64_t n = x.shape()[0], d = x.shape()[1];
      std::vector<double> count(static_cast<size_t>(E), 0.0), psum(static_cast<size_t>(E), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> logit(static_cast<size_t>(E), 0.0);
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t k = 0; k < d; ++k) logit[static_cast<size_t>(e)] += x.at(t * d + k) * w.at(e * d + k);
        }
        const double mx = *std::max_element(logit.begin(), logit.end());
        double sum = 0;
        for (double l : logit) sum += std::exp(l - mx);
        for (int64_t e = 0; e < E; ++e) psum[static_cast<size_t>(e)] += std::exp(logit[static_cast<size_t>(e)] - mx) / sum;
        out.z += std::pow(mx + std::log(sum), 2) / static_cast<double>(n * c.optimizer.accumulation);
        std::vector<int64_t> idx(static_cast<size_t>(E));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
        for (int64_t k = 0; k < K; ++k) count[static_cast<size_t>(idx[static_cast<size_t>(k)])] += 1;
      }
      const auto cap = static_cast<int64_t>(std::ceil(model.capacity_factor * static_cast<double>(n * K) / E));
      for (int64_t e = 0; e < E; ++e) {
        const double ce = count[static_cast<size_t>(e)];
        out.tokens[static_cast<size_t>(e)] += ce;
        out.aux += static_cast<double>(E) * (ce / n) * (psum[static_cast<size_t>(e)] / n) / static_cast<double>(c.optimizer.accumulation);
        if (model.capacity_factor > 0) out.dropped += std::max<int64_t>(0, static_cast<int64_t>(ce) - cap);
      }
    }
  });
  return out;
}

TEST(Llama, MoeMetricsCountTokensPerExpertOnEveryMesh) {
  TrainConfig c = moe_config("dp=1", 3);
  c.model.moe_layers = {0, 1};
  c.model.capacity_factor = 1.0;  // drops: the counts are before capacity, `dropped` after
  const std::vector<StepResult> ref = steps_of(c);
  ASSERT_EQ(ref.size(), 3u);
  for (int64_t layer : {0, 1}) {
    const RouterCount want = count_step_one(c, layer);
    const MoeStepStats& got = ref[0].moe.at(static_cast<size_t>(layer));
    EXPECT_EQ(got.layer, layer);
    EXPECT_EQ(got.tokens_min, *std::min_element(want.tokens.begin(), want.tokens.end())) << layer;
    EXPECT_EQ(got.tokens_max, *std::max_element(want.tokens.begin(), want.tokens.end())) << layer;
    EXPECT_EQ(got.tokens_mean, static_cast<double>(c.optimizer.global_batch * c.model.seq * c.model.top_k) / 4.0);
    EXPECT_EQ(got.dropped, want.dropped) << layer;
    EXPECT_GT(got.dropped, 0) << layer;
    EXPECT_NEAR(got.aux_loss, want.aux, 1e-6) << layer;
    EXPECT_NEAR(got.z_loss, want.z, 1e-5 * want.z) << layer;
  }
  for (const char* mesh : {"ep=2", "dp=2,ep=2", "ep=4"}) {
    c.parallel.mesh = mesh;
    const std::vector<StepResult> got = steps_of(c);
    ASSERT_EQ(got.size(), ref.size()) << mesh;
    for (size_t s = 0; s < ref.size(); ++s) {
      ASSERT_EQ(got[s].moe.size(), 2u) << mesh;
      for (size_t l = 0; l < 2; ++l) {
        const MoeStepStats &a = got[s].moe[l], &b = ref[s].moe[l];
        EXPECT_EQ(a.tokens_min, b.tokens_min) << mesh << " step " << s + 1 << " layer " << l;
        EXPECT_EQ(a.tokens_max, b.tokens_max) << mesh << " step " << s + 1 << " layer " << l;
        EXPECT_EQ(a.dropped, b.dropped) << mesh << " step " << s + 1 << " layer " << l;
        EXPECT_NEAR(a.aux_loss, b.aux_loss, 1e-6) << mesh << " step " << s + 1 << " layer " << l;
      }
    }
  }
}

}  // namespace
}  // namespace shardwise::train
