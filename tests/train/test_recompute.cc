// Activation recompute (graph/recompute.h, --recompute): one step's gradients and loss with full,
// selective and first-layer-only recompute are bit for bit those without recompute on the same
// mesh (the same kernels on the same inputs; dropout draws the same masks), for GPT-2 and Llama on
// 1 rank, dp=2 x tp=2, tp=2 + sp and pp=2 (FThenB, 1F1B, interleaved, zero-bubble); and the activations a
// micro-batch keeps after its forward shrink by exactly what the mode no longer keeps. Also fused
// attention (--attention fused) against the unfused graph on the same helpers.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/train/staged.h"

namespace shardwise::train {
namespace {

constexpr int64_t kMicroBatch = 2;  // sequences per micro-batch per dp rank
constexpr int kMicroBatches = 2;
constexpr uint64_t kSeed = 99;

GptConfig small(const std::string& type, int64_t layers) {
  GptConfig m;
  m.model_type = type;
  m.layers = layers, m.heads = 4, m.hidden = 32, m.seq = 10, m.vocab = 128;
  if (m.is_llama()) m.kv_heads = 2, m.intermediate_size = 48, m.tie_word_embeddings = false;
  m.dropout = 0.1;
  m.dropout_seed = kSeed;
  m.attention = "unfused";  // the selective formulas are the unfused core's (fused: FusedAttention* below)
  return m;
}

GptConfig with_recompute(GptConfig m, const std::string& mode, int64_t layers = -1) {
  m.recompute = mode;
  m.recompute_layers = layers;
  return m;
}

struct Step {
  std::map<std::string, Tensor> grads;  // "rank/parameter": each rank's block
  double loss = 0;
  std::map<int, int64_t> forward_bytes;  // rank 0's, per local stage
  int64_t peak = 0;                      // rank 0's peak activation bytes
};

Step run(const GptConfig& model, const std::string& mesh, bool sp, const std::string& schedule = "1f1b") {
  Step out;
  Strategy strategy = Strategy::from_mesh(mesh::parse_mesh(mesh), sp);
  AdditionTask data(2, model.seq, kSeed);
  PipelineConfig pc{schedule, schedule == "interleaved" ? 2 : 1, true, true, {}};  // released tensors poisoned
  std::mutex mu;
  comm::LocalWorld::run(static_cast<int>(strategy.mesh.size()), [&](comm::Communicator& world) {
    StagedGpt m(model, strategy, pc, kMicroBatch * strategy.dp_size(), kMicroBatches, kSeed, causal_mask(model.seq),
                world.group(world.members()));
    StagedGpt::Result r = m.forward_backward(&data, 0);
    std::lock_guard lock(mu);
    for (size_t i = 0; i < m.params().size(); ++i)
      out.grads[fmt::format("{}/{}", world.rank(), m.params()[i].name)] = r.grads[i];
    if (world.rank() == 0) {
      out.loss = r.loss;
      out.forward_bytes = m.last_stats().forward_bytes;
      out.peak = m.last_stats().peak_activation_bytes;
    }
  });
  return out;
}

void expect_identical(const Step& got, const Step& ref, const std::string& what) {
  EXPECT_EQ(got.loss, ref.loss) << what;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (const auto& [name, g] : ref.grads) {
    const Tensor& t = got.grads.at(name);
    ASSERT_EQ(t.nbytes(), g.nbytes()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(t.raw(), g.raw(), g.nbytes()), 0) << what << ": " << name << " differs";
  }
}

int64_t kept_bytes(const Step& s) {
  int64_t bytes = 0;
  for (auto [stage, b] : s.forward_bytes) bytes += b;
  return bytes;
}

void expect_identical_on_every_mesh(const std::string& type) {
  struct Case {
    const char* mesh;
    bool sp;
    const char* schedule;
  };
  for (Case c : {Case{"dp=1", false, "1f1b"}, Case{"dp=2,tp=2", false, "1f1b"}, Case{"tp=2", true, "1f1b"},
                 Case{"pp=2", false, "fthenb"}, Case{"pp=2", false, "1f1b"}, Case{"pp=2", false, "interleaved"},
                 Case{"pp=2", false, "zbh1"}}) {
    GptConfig model = small(type, 4);
    const Step ref = run(model, c.mesh, c.sp, c.schedule);
    for (const auto& [mode, layers] : {std::pair{"full", -1}, {"selective", -1}, {"full", 1}, {"selective", 1}}) {
      std::string what = fmt::format("{} {}{} {}: --recompute {} --recompute-layers {}", type, c.mesh,
                                     c.sp ? " + sp" : "", c.schedule, mode, layers);
      const Step got = run(with_recompute(model, mode, layers), c.mesh, c.sp, c.schedule);
      expect_identical(got, ref, what);
      EXPECT_LT(kept_bytes(got), kept_bytes(ref)) << what << ": recompute should keep less after the forward";
    }
  }
}

TEST(Recompute, Gpt2GradientsAreBitIdenticalOnEveryMeshAndSchedule) { expect_identical_on_every_mesh("gpt2"); }

TEST(Recompute, LlamaGradientsAreBitIdenticalOnEveryMeshAndSchedule) { expect_identical_on_every_mesh("llama"); }

// What a micro-batch keeps after its forward (one stage, one rank; B sequences of S tokens, NH heads,
// hidden H, f32): full keeps one residual stream [B, S, H] per layer and nothing else of the layer,
// so one more layer adds exactly B S H x 4 bytes. Selective no longer keeps, per layer, the
// attention probabilities (softmax's gradient reads its output), the dropped-out probabilities
// (probs x V's gradient reads them) and the dropout mask (u8): B NH S S x (4 + 4 + 1) bytes.
TEST(Recompute, KeptActivationBytesFollowTheirFormulas) {
  for (const char* type : {"gpt2", "llama"}) {
    auto kept = [&](int64_t layers, const std::string& mode, int64_t n = -1) {
      return run(with_recompute(small(type, layers), mode, n), "dp=1", false).forward_bytes.at(0);
    };
    const GptConfig m = small(type, 3);
    const int64_t B = kMicroBatch, S = m.seq, H = m.hidden, NH = m.heads;
    const int64_t none = kept(3, "none"), selective = kept(3, "selective"), full = kept(3, "full");
    SCOPED_TRACE(fmt::format("{}: none {} B, selective {} B, full {} B", type, none, selective, full));
    EXPECT_LT(full, selective);
    EXPECT_LT(selective, none);
    EXPECT_EQ(kept(3, "full") - kept(2, "full"), B * S * H * 4);
    EXPECT_EQ(none - selective, 3 * B * NH * S * S * (4 + 4 + 1));
    // --recompute-layers 1: the first layer as full recompute keeps it, the others as without.
    EXPECT_EQ(kept(3, "full", 1) - full, 2 * (none - full) / 3);
    EXPECT_EQ(kept(3, "selective", 2), none - 2 * (none - selective) / 3);
  }
}

// With fused attention (the default) the core keeps nothing [S, S]: selective recompute marks no
// segment and keeps what no recompute keeps; full recompute re-runs the fused kernel (dropout
// included) bit for bit. Per layer the fused core keeps, instead of the unfused core's probabilities,
// dropped-out probabilities and mask (B NH S S x 9 bytes), its output [B, NH, S, HD] and log-sum-exp
// [B, NH, S] (f32): exactly that for GPT-2; Llama's grouped q, k, v keep less besides.
TEST(Recompute, FusedAttentionFullIsBitIdenticalAndSelectiveKeepsWhatNoneKeeps) {
  for (const char* type : {"gpt2", "llama"}) {
    for (const char* mesh : {"dp=1", "dp=2,tp=2", "pp=2"}) {
      GptConfig model = small(type, 2);
      model.attention = "fused";
      const Step ref = run(model, mesh, false);
      const std::string what = fmt::format("{} {} fused", type, mesh);
      const Step full = run(with_recompute(model, "full"), mesh, false);
      expect_identical(full, ref, what + " --recompute full");
      EXPECT_LT(kept_bytes(full), kept_bytes(ref)) << what;
      const Step selective = run(with_recompute(model, "selective"), mesh, false);
      expect_identical(selective, ref, what + " --recompute selective");
      EXPECT_EQ(kept_bytes(selective), kept_bytes(ref)) << what;
    }
    const GptConfig m = small(type, 3);
    GptConfig fused = m;
    fused.attention = "fused";
    const int64_t B = kMicroBatch, S = m.seq, NH = m.heads, HD = m.hidden / m.heads;
    const int64_t unfused_kept = run(m, "dp=1", false).forward_bytes.at(0);
    const int64_t fused_kept = run(fused, "dp=1", false).forward_bytes.at(0);
    const int64_t per_layer = B * NH * S * S * (4 + 4 + 1) - B * NH * S * HD * 4 - B * NH * S * 4;
    if (m.is_llama()) {  // and the layouts of q, k, v differ (grouped, not repeated): at least that much
      EXPECT_GE(unfused_kept - fused_kept, 3 * per_layer) << type;
    } else {
      EXPECT_EQ(unfused_kept - fused_kept, 3 * per_layer) << type;
    }
  }
}

// The fused core computes what the unfused graph computes, attention dropout included (the same
// masks: with other masks the losses would differ by ~1e-2), up to float summation order: the loss
// and every gradient on 1 rank, dp x tp (Llama: grouped kv heads sharded over tp) and pp.
TEST(FusedAttention, LossAndGradientsFollowTheUnfusedGraphWithDropout) {
  for (const char* type : {"gpt2", "llama"}) {
    for (const char* mesh : {"dp=1", "dp=2,tp=2", "pp=2"}) {
      const GptConfig unfused = small(type, 2);
      GptConfig fused = unfused;
      fused.attention = "fused";
      const Step a = run(fused, mesh, false), b = run(unfused, mesh, false);
      const std::string what = fmt::format("{} {}", type, mesh);
      EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(b.loss)) << what;
      ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
      for (const auto& [name, g] : b.grads) {
        const Tensor& t = a.grads.at(name);
        for (int64_t i = 0; i < g.numel(); ++i)
          ASSERT_NEAR(t.at(i), g.at(i), 1e-5 * std::max(1.0, std::abs(g.at(i)))) << what << ": " << name << " " << i;
      }
    }
  }
}

TEST(Recompute, BadModesAndLayerCountsAreRefusedNamingThem) {
  auto error_of = [](const std::string& mode, int64_t layers) {
    try {
      with_recompute(small("gpt2", 2), mode, layers).validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("partial", -1).find("--recompute 'partial' is not a recompute mode (none, full, selective)"),
            std::string::npos);
  EXPECT_NE(error_of("full", 0).find("--recompute-layers must be at least 1"), std::string::npos);
  EXPECT_NE(error_of("none", 2).find("--recompute-layers 2 needs --recompute full or selective"), std::string::npos);
  EXPECT_EQ(error_of("selective", 5), "");  // more than a stage holds: every layer
}

}  // namespace
}  // namespace shardwise::train
