// Validation of --data runs (Trainer::validate): the same loss on every mesh, equal to a plain
// reference forward written here, and no effect on the training trajectory.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/train/trainer.h"

namespace shardwise::train {
namespace {

namespace fs = std::filesystem;

// A headerless uint16 corpus (.bin: auto-detected) of `n` tokens below `vocab` with some structure
// to learn (each token mostly follows from the one before).
fs::path corpus(const std::string& name, uint32_t n, uint32_t vocab) {
  fs::path d = fs::temp_directory_path() / "shardwise-validation";
  fs::create_directories(d);
  fs::path p = d / (name + ".bin");
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint32_t t = 1;
  for (uint32_t i = 0; i < n; ++i) {
    t = (t * 5 + 3 + (i % 11 == 0 ? i % 7 : 0)) % vocab;
    out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
  }
  return p;
}

TrainConfig val_config(const std::string& mesh, const fs::path& data) {
  TrainConfig c;
  c.model.layers = 2, c.model.heads = 4, c.model.hidden = 32, c.model.seq = 16, c.model.vocab = 64;
  c.mesh = mesh;
  c.steps = 20;
  c.global_batch = 8;
  c.lr = 1e-2, c.min_lr = 1e-3, c.warmup = 1;
  c.data = data.string();
  c.val_fraction = 0.25;
  c.val_samples = 6;  // not a multiple of any micro-batch below: the last one is padded
  return c;
}

int ranks_of(const TrainConfig& c) { return static_cast<int>(mesh::parse_mesh(c.mesh).size()); }

// The validation loss before training and after `steps` steps (rank 0's; every rank must agree).
std::vector<double> validation_losses(const TrainConfig& c, int steps) {
  std::vector<double> out;
  comm::LocalWorld::run(ranks_of(c), [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    std::vector<double> mine = {t.validate().loss};
    for (int s = 0; s < steps; ++s) t.step();
    mine.push_back(t.validate().loss);
    if (w.rank() == 0) out = mine;
  });
  return out;
}

TEST(Validation, TheLossIsTheSameOnEveryMesh) {
  fs::path data = corpus("meshes", 6000, 64);
  std::vector<double> ref = validation_losses(val_config("dp=1", data), 3);
  ASSERT_EQ(ref.size(), 2u);
  EXPECT_LT(ref[1], ref[0]) << "three steps should lower the validation loss";
  struct Case {
    std::string mesh;
    bool sp = false;
    int64_t accumulation = 0;
  };
  for (const Case& k : {Case{"dp=2"}, Case{"tp=2"}, Case{"dp=2,tp=2"}, Case{"tp=2", true}, Case{"pp=2", false, 2},
                        Case{"pp=2,dp=2", false, 2}}) {
    TrainConfig c = val_config(k.mesh, data);
    c.sequence_parallel = k.sp;
    c.accumulation = k.accumulation;
    std::vector<double> got = validation_losses(c, 3);
    ASSERT_EQ(got.size(), 2u);
    const std::string what = k.mesh + (k.sp ? " + sp" : "");
    EXPECT_NEAR(got[0], ref[0], 1e-5) << what << ", before training";
    EXPECT_NEAR(got[1], ref[1], 1e-5) << what << ", after 3 steps";
  }
}

// ---- a plain reference: GPT-2's forward in double, one sequence at a time -------------------------

using Params = std::map<std::string, std::vector<double>>;
using Rows = std::vector<std::vector<double>>;  // [positions][features]

Rows layer_norm(const Rows& x, const Params& p, const std::string& name, double eps) {
  const std::vector<double>&w = p.at(name + ".weight"), &b = p.at(name + ".bias");
  Rows y = x;
  for (auto& row : y) {
    double mean = 0, var = 0;
    for (double v : row) mean += v;
    mean /= static_cast<double>(row.size());
    for (double v : row) var += (v - mean) * (v - mean);
    var /= static_cast<double>(row.size());
    for (size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  }
  return y;
}

// x [S, n_in] times weight [n_in, n_out] plus bias.
Rows linear(const Rows& x, const Params& p, const std::string& name) {
  const std::vector<double>&w = p.at(name + ".weight"), &b = p.at(name + ".bias");
  const size_t n_in = x[0].size(), n_out = b.size();
  Rows y(x.size(), std::vector<double>(n_out));
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t j = 0; j < n_out; ++j) {
      double s = b[j];
      for (size_t i = 0; i < n_in; ++i) s += x[t][i] * w[i * n_out + j];
      y[t][j] = s;
    }
  return y;
}

Rows causal_attention(const Rows& q, const Rows& k, const Rows& v, int64_t heads) {
  const size_t S = q.size(), H = q[0].size(), hd = H / static_cast<size_t>(heads);
  Rows ctx(S, std::vector<double>(H, 0.0));
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h)
    for (size_t t = 0; t < S; ++t) {
      std::vector<double> score(t + 1);
      double mx = -1e300, sum = 0;
      for (size_t u = 0; u <= t; ++u) {
        double s = 0;
        for (size_t d = 0; d < hd; ++d) s += q[t][h * hd + d] * k[u][h * hd + d];
        score[u] = s / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, score[u]);
      }
      for (double& s : score) sum += (s = std::exp(s - mx));
      for (size_t u = 0; u <= t; ++u)
        for (size_t d = 0; d < hd; ++d) ctx[t][h * hd + d] += score[u] / sum * v[u][h * hd + d];
    }
  return ctx;
}

// The summed next-token cross-entropy of one sequence (tokens: seq + 1).
double sequence_loss(const std::vector<int64_t>& tokens, const Params& p, const GptConfig& c) {
  const auto S = static_cast<size_t>(c.seq), H = static_cast<size_t>(c.hidden), V = static_cast<size_t>(c.vocab);
  const std::vector<double>&wte = p.at("transformer.wte.weight"), &wpe = p.at("transformer.wpe.weight");
  Rows x(S, std::vector<double>(H));
  for (size_t t = 0; t < S; ++t)
    for (size_t i = 0; i < H; ++i) x[t][i] = wte[static_cast<size_t>(tokens[t]) * H + i] + wpe[t * H + i];
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "transformer.h." + std::to_string(l);
    Rows h = layer_norm(x, p, b + ".ln_1", c.layer_norm_epsilon);
    Rows a = linear(causal_attention(linear(h, p, b + ".attn.q_proj"), linear(h, p, b + ".attn.k_proj"),
                                     linear(h, p, b + ".attn.v_proj"), c.heads),
                    p, b + ".attn.c_proj");
    for (size_t t = 0; t < S; ++t)
      for (size_t i = 0; i < H; ++i) x[t][i] += a[t][i];
    Rows f = linear(layer_norm(x, p, b + ".ln_2", c.layer_norm_epsilon), p, b + ".mlp.c_fc");
    for (auto& row : f)
      for (double& u : row) u = 0.5 * u * (1 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
    Rows m = linear(f, p, b + ".mlp.c_proj");
    for (size_t t = 0; t < S; ++t)
      for (size_t i = 0; i < H; ++i) x[t][i] += m[t][i];
  }
  x = layer_norm(x, p, "transformer.ln_f", c.layer_norm_epsilon);
  double total = 0;
  for (size_t t = 0; t < S; ++t) {
    std::vector<double> logits(V);
    double mx = -1e300, sum = 0;
    for (size_t v = 0; v < V; ++v) {
      for (size_t i = 0; i < H; ++i) logits[v] += x[t][i] * wte[v * H + i];
      mx = std::max(mx, logits[v]);
    }
    for (double z : logits) sum += std::exp(z - mx);
    total += mx + std::log(sum) - logits[static_cast<size_t>(tokens[t + 1])];
  }
  return total;
}

// The reference mean over the run's validation sequences, with the trainer's current weights.
double reference_loss(Trainer& t) {
  Params p;
  for (ParamState& q : t.params()) {
    Tensor whole = t.gather_param(q.name);
    p[q.name].assign(whole.data<float>(), whole.data<float>() + whole.numel());
  }
  const EvenWindows& val = *t.validation_data();
  std::vector<int64_t> tokens(static_cast<size_t>(t.config().model.seq + 1));
  double total = 0;
  for (int64_t k = 0; k < val.size(); ++k) {
    val.sample(k, tokens);
    total += sequence_loss(tokens, p, t.config().model);
  }
  return total / static_cast<double>(val.size() * t.config().model.seq);
}

// With --dropout too: validation runs without it.
TEST(Validation, TheLossEqualsAPlainReferenceForward) {
  TrainConfig c = val_config("dp=1", corpus("reference", 6000, 64));
  c.dropout = 0.1;
  comm::LocalWorld::run(1, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    ASSERT_EQ(t.validation_data()->size(), 6);
    const double at_start = reference_loss(t);
    EXPECT_NEAR(t.validate().loss, at_start, 1e-5) << "step 0";
    EXPECT_EQ(t.validate().loss, t.validate().loss);
    for (int s = 0; s < 6; ++s) t.step();
    const double trained = reference_loss(t);
    EXPECT_LT(trained, at_start - 0.1) << "the weights should have moved away from the initial ones";
    ValidationResult v = t.validate();
    EXPECT_NEAR(v.loss, trained, 1e-5) << "after 6 steps";
    EXPECT_EQ(v.sequences, 6);
    EXPECT_DOUBLE_EQ(v.perplexity(), std::exp(v.loss));
  });
}

// ---- no effect on training ----------------------------------------------------------------------

// Rank 0's training losses, with validate() after every step or not at all.
std::vector<double> training_losses(const TrainConfig& c, int steps, bool validate) {
  std::vector<double> out;
  comm::LocalWorld::run(ranks_of(c), [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int s = 0; s < steps; ++s) {
      double loss = t.step().loss;
      if (validate) t.validate();
      if (w.rank() == 0) out.push_back(loss);
    }
  });
  return out;
}

TEST(Validation, TrainingLossesAreBitIdenticalWithAndWithoutIt) {
  fs::path data = corpus("trajectory", 6000, 64), val = corpus("trajectory-val", 1500, 64);
  // --val-fraction with dropout (masks are keyed by sample: validation must draw none).
  TrainConfig held = val_config("dp=2,tp=2", data);
  held.dropout = 0.1;
  std::vector<double> with = training_losses(held, 4, true), without = training_losses(held, 4, false);
  ASSERT_EQ(with.size(), 4u);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i], without[i]) << "--val-fraction, step " << i + 1;
  // --val-data leaves the training data as it is: the same losses as a run without validation.
  TrainConfig plain = val_config("pp=2", data);
  plain.accumulation = 2, plain.dropout = 0.1, plain.val_fraction = 0;
  TrainConfig separate = plain;
  separate.val_data = val.string();
  with = training_losses(separate, 4, true), without = training_losses(plain, 4, false);
  ASSERT_EQ(with.size(), 4u);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i], without[i]) << "--val-data on pp=2, step " << i + 1;
}

// A corpus whose tokens are their own positions: everything the run trained on lies before the cut.
TEST(Validation, TrainingNeverReadsTheHeldOutTokens) {
  fs::path p = fs::temp_directory_path() / "shardwise-validation" / "positions.bin";
  fs::create_directories(p.parent_path());
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    for (uint32_t t = 0; t < 3000; ++t) out.put(static_cast<char>(t & 0xFF)).put(static_cast<char>(t >> 8));
  }
  TrainConfig c = val_config("dp=2", p);
  c.model.layers = 1, c.model.vocab = 3000, c.val_fraction = 0.2;  // the cut: token 2400
  comm::LocalWorld::run(2, [&](comm::Communicator& w) {
    Trainer t(c, w.group(w.members()));
    for (int s = 0; s < 3; ++s) t.step();
    t.validate();
    if (w.rank() != 0) return;
    const auto* training = dynamic_cast<const TokenFile*>(&t.dataset());
    ASSERT_NE(training, nullptr);
    EXPECT_EQ(training->token_count(), 2400);
    EXPECT_EQ(t.consumed_samples(), 24);
    std::vector<int64_t> w_tokens(17);
    for (int64_t i = 0; i < t.consumed_samples(); ++i) {
      t.dataset().sample(i, w_tokens);
      EXPECT_LT(w_tokens.back(), 2400) << "training sample " << i;
    }
    const EvenWindows& val = *t.validation_data();
    EXPECT_EQ(val.size(), 6);
    for (int64_t k = 0; k < val.size(); ++k) {
      val.sample(k, w_tokens);
      EXPECT_GE(w_tokens.front(), 2400) << "validation sequence " << k;
    }
  });
}

}  // namespace
}  // namespace shardwise::train
