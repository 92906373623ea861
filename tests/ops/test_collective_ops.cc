// The collective ops run as threads on a mesh (comm::LocalWorld), each rank on its own blocks:
// sync_batch_norm against single-device batch_norm over the global batch (and a hand-written
// running-statistics update with the global count), vocab_parallel_cross_entropy against the
// closed formula loss_i = log(sum_c exp(z_ic)) - z_i,label and dlogits = (softmax - onehot) * w.
// Every rank's local result is compared with its block of the global reference.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/op.h"

namespace shardwise::ops {
namespace {

using mesh::DistAttr;
using mesh::ProcessMesh;

Tensor random(const Shape& s, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor t(DType::F64, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_at(i, dist(gen));
  return t;
}

// One tensor as the ranks see it: its global value and its distribution.
struct Placed {
  Tensor global;
  DistAttr dist;
};

mesh::LocalBlock block_of(const Placed& p, const ProcessMesh& mesh, int64_t rank) {
  return mesh::local_block(p.global.shape(), p.dist, mesh, mesh.coords(rank));
}

Tensor local_part(const Tensor& global, const mesh::LocalBlock& b) { return global.slice(b.offsets(), b.shape); }

using RankKernel = std::function<std::vector<Tensor>(std::span<const Tensor>, const KernelContext&)>;

// Runs `kernel` on every rank of `mesh` as threads, each with its blocks of `tensors`, their
// context and its MeshComm; returns every rank's outputs.
std::vector<std::vector<Tensor>> run_on_mesh(const ProcessMesh& mesh, const std::vector<Placed>& tensors,
                                             const RankKernel& kernel) {
  auto n = static_cast<size_t>(mesh.size());
  std::vector<std::vector<Tensor>> outputs(n);
  comm::LocalWorld::run(static_cast<int>(n), [&](comm::Communicator& world) {
    int64_t r = world.rank();
    comm::MeshComm mesh_comm(mesh, world.group(world.members()));
    KernelContext ctx;
    ctx.mesh_comm = &mesh_comm;
    std::vector<Tensor> locals;
    for (const Placed& p : tensors) {
      mesh::LocalBlock b = block_of(p, mesh, r);
      locals.push_back(local_part(p.global, b));
      ctx.tensors.push_back({p.global.shape(), b.offset, p.dist});
    }
    outputs[static_cast<size_t>(r)] = kernel(locals, ctx);
  });
  return outputs;
}

// Every rank's output `o` equals its block (under `dist`) of `expected`.
void expect_blocks(const ProcessMesh& mesh, const std::vector<std::vector<Tensor>>& outputs, size_t o,
                   const Placed& expected, double tol, const std::string& what) {
  for (int64_t r = 0; r < mesh.size(); ++r) {
    Tensor want = local_part(expected.global, block_of(expected, mesh, r));
    const Tensor& got = outputs[static_cast<size_t>(r)][o];
    ASSERT_EQ(got.shape(), want.shape()) << what << " on rank " << r;
    for (int64_t i = 0; i < want.numel(); ++i) {
      EXPECT_NEAR(got.at(i), want.at(i), tol) << what << " on rank " << r << " element " << i;
    }
  }
}

// ---- sync_batch_norm

struct BnCase {
  Shape mesh, x;
  std::string x_dist, c_dist;
  bool channels_last;
};

Attrs bn_attrs(bool training, bool channels_last) {
  return Attrs{{"training", training},
               {"momentum", 0.7},
               {"epsilon", 1e-3},
               {"data_format", std::string(channels_last ? "NHWC" : "NCHW")}};
}

// Batch and spatial sharded over both mesh dims; the batch co-sharded over 4 ranks with 3 rows
// (an empty shard); channels sharded too, with an empty channel shard (4 over 3); channels last.
const BnCase kBnCases[] = {
    {{2, 2}, {6, 4, 3}, "S(0),S(2)", "R,R", false},
    {{2, 2}, {3, 2, 2, 2}, "S(0),S(0)", "R,R", false},
    {{2, 3}, {5, 2, 4}, "S(0),S(2)", "R,S(0)", true},
    {{3}, {7, 2}, "S(0)", "R", false},
};

TEST(SyncBatchNorm, EqualsBatchNormOverTheGlobalBatch) {
  const OpDef& sync = op_registry().get("sync_batch_norm");
  const OpDef& bn = op_registry().get("batch_norm");
  for (const BnCase& c : kBnCases) {
    SCOPED_TRACE(c.x.to_string() + " [" + c.x_dist + "]");
    ProcessMesh mesh(c.mesh);
    int nd = mesh.ndim();
    int64_t C = c.x[c.channels_last ? c.x.ndim() - 1 : 1];
    Attrs attrs = bn_attrs(true, c.channels_last);
    std::vector<Tensor> in = {random(c.x, 1), random({C}, 2), random({C}, 3), random({C}, 4), random({C}, 5, 0.5, 2)};
    std::vector<Tensor> ref = run_forward(bn, in, attrs);
    DistAttr xd = mesh::parse_dist(c.x_dist, nd), cd = mesh::parse_dist(c.c_dist, nd);
    std::vector<Placed> placed = {{in[0], xd}, {in[1], cd}, {in[2], cd}, {in[3], cd}, {in[4], cd}};
    auto outs = run_on_mesh(mesh, placed, [&](std::span<const Tensor> local, const KernelContext& ctx) {
      return run_forward(sync, local, attrs, &ctx);
    });
    expect_blocks(mesh, outs, 0, {ref[0], xd}, 1e-12, "out");
    for (size_t o = 1; o < 5; ++o) expect_blocks(mesh, outs, o, {ref[o], cd}, 1e-12, "statistic " + std::to_string(o));

    // The running variance uses the unbiased variance with the GLOBAL count, by hand.
    int64_t n = in[0].numel() / C;
    Tensor want_rv(DType::F64, {C});
    for (int64_t ch = 0; ch < C; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < in[0].numel(); ++i) {
        int64_t at = c.channels_last ? i % C : (i / (in[0].numel() / c.x[0] / C)) % C;
        if (at != ch) continue;
        sum += in[0].at(i);
      }
      double mean = sum / static_cast<double>(n);
      for (int64_t i = 0; i < in[0].numel(); ++i) {
        int64_t at = c.channels_last ? i % C : (i / (in[0].numel() / c.x[0] / C)) % C;
        if (at == ch) sq += (in[0].at(i) - mean) * (in[0].at(i) - mean);
      }
      want_rv.set_at(ch, 0.7 * in[4].at(ch) + 0.3 * sq / static_cast<double>(n - 1));
    }
    expect_blocks(mesh, outs, 2, {want_rv, cd}, 1e-12, "running_var by hand");

    // Backward: dx like x; dscale / dbias whole on every rank of a channel block (Replicate).
    Tensor dy = random(c.x, 6);
    std::vector<Tensor> ref_g = run_backward(bn, in, ref, std::vector<Tensor>{dy, {}, {}, {}, {}}, attrs);
    std::vector<Placed> grad_placed = placed;
    grad_placed.push_back({ref[0], xd});
    for (size_t o = 1; o < 5; ++o) grad_placed.push_back({ref[o], cd});
    grad_placed.push_back({dy, xd});
    for (size_t o = 1; o < 5; ++o) grad_placed.push_back({Tensor::full(DType::F64, {C}, 0), cd});
    auto grads = run_on_mesh(mesh, grad_placed, [&](std::span<const Tensor> t, const KernelContext& ctx) {
      return run_backward(sync, t.subspan(0, 5), t.subspan(5, 5), t.subspan(10, 5), attrs, &ctx);
    });
    expect_blocks(mesh, grads, 0, {ref_g[0], xd}, 1e-12, "dx");
    expect_blocks(mesh, grads, 1, {ref_g[1], cd}, 1e-12, "dscale");
    expect_blocks(mesh, grads, 2, {ref_g[2], cd}, 1e-12, "dbias");
  }
}

TEST(SyncBatchNorm, OneDeviceAndInferenceAreBatchNorm) {
  const OpDef& sync = op_registry().get("sync_batch_norm");
  const OpDef& bn = op_registry().get("batch_norm");
  EXPECT_TRUE(sync.collective);
  EXPECT_FALSE(bn.collective);
  std::vector<Tensor> in = {random({4, 3, 2}, 11), random({3}, 12), random({3}, 13), random({3}, 14),
                            random({3}, 15, 0.5, 2)};
  for (bool training : {true, false}) {
    Attrs attrs = bn_attrs(training, false);
    std::vector<Tensor> got = run_forward(sync, in, attrs), want = run_forward(bn, in, attrs);
    for (size_t o = 0; o < 5; ++o) {
      CompareResult cmp = compare(got[o], want[o], 1e-12, 1e-12);
      EXPECT_TRUE(cmp.equal) << "training " << training << " output " << o << ": " << cmp.message;
    }
  }
}

TEST(SyncBatchNorm, ErrorsNameTheOp) {
  const OpDef& sync = op_registry().get("sync_batch_norm");
  Attrs attrs = bn_attrs(true, false);
  std::vector<Tensor> in = {random({4, 2}, 21), random({2}, 22), random({2}, 23), random({2}, 24),
                            random({2}, 25, 0.5, 2)};
  // A Partial x cannot be normalized from its parts' statistics.
  KernelContext ctx = KernelContext::single_device(in);
  ctx.tensors[0].dist = mesh::parse_dist("P(sum)", 1);
  try {
    run_forward(sync, in, attrs, &ctx);
    ADD_FAILURE() << "a Partial x was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sync_batch_norm: input 0 is Partial"), std::string::npos) << e.what();
  }
  // One value per channel over the whole batch: no variance to estimate.
  std::vector<Tensor> one = {random({1, 2}, 26), in[1], in[2], in[3], in[4]};
  try {
    run_forward(sync, one, attrs);
    ADD_FAILURE() << "a batch of one was accepted in training";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sync_batch_norm: training needs more than 1 value"), std::string::npos)
        << e.what();
  }
}

// ---- vocab_parallel_cross_entropy

// Closed formula per row (0 on ignored rows) and the per-row gradient weight's base.
struct CeRef {
  std::vector<double> loss;
  Tensor softmax_minus_onehot;
  int64_t count = 0;
};

CeRef closed_form(const Tensor& logits, const std::vector<int64_t>& labels, int64_t ignore_index) {
  const int64_t V = logits.shape().back();
  CeRef r{std::vector<double>(labels.size(), 0.0), Tensor(DType::F64, logits.shape()), 0};
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == ignore_index) continue;
    ++r.count;
    double z = 0;
    for (int64_t c = 0; c < V; ++c) z += std::exp(logits.at(static_cast<int64_t>(i) * V + c));
    r.loss[i] = std::log(z) - logits.at(static_cast<int64_t>(i) * V + labels[i]);
    for (int64_t c = 0; c < V; ++c) {
      int64_t at = static_cast<int64_t>(i) * V + c;
      r.softmax_minus_onehot.set_at(at, std::exp(logits.at(at)) / z - (c == labels[i] ? 1.0 : 0.0));
    }
  }
  return r;
}

TEST(VocabParallelCrossEntropy, ClassShardedEqualsTheClosedFormula) {
  const OpDef& op = op_registry().get("vocab_parallel_cross_entropy");
  EXPECT_TRUE(op.collective);
  // V = 5 over 4 ranks: class blocks of 2, 2, 1 and 0.
  ProcessMesh mesh(Shape{2, 2});
  Tensor logits = random({3, 5}, 31);
  std::vector<int64_t> ids = {4, 0, 2};  // class 4 lives on the third rank; 0 is ignored below
  Tensor labels = Tensor::from<int64_t>({3}, ids);
  DistAttr ld = mesh::parse_dist("S(1),S(1)", 2), rep(2);
  CeRef ref = closed_form(logits, ids, 0);
  for (const char* reduction : {"none", "sum", "mean"}) {
    SCOPED_TRACE(reduction);
    Attrs attrs{{"reduction", std::string(reduction)}, {"ignore_index", int64_t{0}}};
    auto forward = [&](std::span<const Tensor> t, const KernelContext& ctx) { return run_forward(op, t, attrs, &ctx); };
    auto outs = run_on_mesh(mesh, {{logits, ld}, {labels, rep}}, forward);
    double total = ref.loss[0] + ref.loss[1] + ref.loss[2];
    std::string r = reduction;
    double scalar = r == "sum" ? total : total / static_cast<double>(ref.count);
    Tensor want = r == "none" ? Tensor::from<double>({3}, ref.loss)
                              : Tensor::from<double>({}, std::vector<double>{scalar});
    expect_blocks(mesh, outs, 0, {want, rep}, 1e-12, "loss");

    // dlogits stays class-sharded: (softmax - onehot) * w on every block.
    Tensor dloss = r == "none" ? Tensor::from<double>({3}, std::vector<double>{0.5, -1.0, 2.0})
                               : Tensor::from<double>({}, std::vector<double>{1.5});
    Tensor want_dx(DType::F64, logits.shape());
    for (int64_t i = 0; i < logits.numel(); ++i) {
      double w = r == "none" ? dloss.at(i / 5) : dloss.at(0);
      if (r == "mean") w /= static_cast<double>(ref.count);
      want_dx.set_at(i, ref.softmax_minus_onehot.at(i) * w);
    }
    auto grads = run_on_mesh(mesh, {{logits, ld}, {labels, rep}, {want, rep}, {dloss, rep}},
                             [&](std::span<const Tensor> t, const KernelContext& ctx) {
                               return run_backward(op, t.subspan(0, 2), t.subspan(2, 1), t.subspan(3, 1), attrs, &ctx);
                             });
    expect_blocks(mesh, grads, 0, {want_dx, ld}, 1e-12, "dlogits");
    for (const auto& g : grads) EXPECT_FALSE(g[1].defined()) << "labels take no gradient";
  }
}

TEST(VocabParallelCrossEntropy, BatchAndClassShardedSumsEachRanksRows) {
  const OpDef& op = op_registry().get("vocab_parallel_cross_entropy");
  // Rows 4 over mesh dim 0 (2, 2), classes 7 over mesh dim 1 (3, 3, 1).
  ProcessMesh mesh(Shape{2, 3});
  Tensor logits = random({4, 7}, 41);
  std::vector<int64_t> ids = {6, 1, 3, 0};
  Tensor labels = Tensor::from<int64_t>({4}, ids);
  CeRef ref = closed_form(logits, ids, -100);
  Attrs attrs{{"reduction", std::string("sum")}};
  auto outs = run_on_mesh(mesh, {{logits, mesh::parse_dist("S(0),S(1)", 2)}, {labels, mesh::parse_dist("S(0),R", 2)}},
                          [&](std::span<const Tensor> t, const KernelContext& ctx) {
                            return run_forward(op, t, attrs, &ctx);
                          });
  // A rank's loss is the sum over its two rows (the rule's Partial(sum) over the batch).
  for (int64_t r = 0; r < mesh.size(); ++r) {
    size_t first = mesh.coords(r)[0] == 0 ? 0 : 2;
    EXPECT_NEAR(outs[static_cast<size_t>(r)][0].at(0), ref.loss[first] + ref.loss[first + 1], 1e-12) << "rank " << r;
  }
  // With no communicator the op is plain cross_entropy.
  std::vector<Tensor> in = {logits, labels};
  Tensor plain = run_forward(op_registry().get("cross_entropy"), in, attrs)[0];
  CompareResult cmp = compare(run_forward(op, in, attrs)[0], plain, 0, 0);
  EXPECT_TRUE(cmp.equal) << cmp.message;
}

// ---- vocab_parallel_lm_head_cross_entropy

// Rows 5 over mesh dim 0 (3, 2), the vocab 7 over mesh dim 1 (3, 3, 1: unequal blocks), chunks of
// one row (5 chunks, every rank the same count) and of two rows (3 chunks, the last short); label 0
// ignored. Against the closed formula of the logits h·Wᵀ computed here in f64: each rank's loss rows,
// dh summed over the vocab ranks, dW summed over the row ranks.
TEST(VocabParallelLmHeadCrossEntropy, UnevenVocabBlocksEqualTheClosedFormula) {
  const OpDef& op = op_registry().get("vocab_parallel_lm_head_cross_entropy");
  EXPECT_TRUE(op.collective);
  ProcessMesh mesh(Shape{2, 3});
  const int64_t N = 5, H = 4, V = 7;
  Tensor h = random({N, H}, 51), w = random({V, H}, 52);
  std::vector<int64_t> ids = {6, 0, 3, 2, 0};
  Tensor labels = Tensor::from<int64_t>({N}, ids);
  Tensor logits(DType::F64, {N, V});
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < V; ++c)
      for (int64_t k = 0; k < H; ++k) logits.set_at(i * V + c, logits.at(i * V + c) + h.at(i * H + k) * w.at(c * H + k));
  CeRef ref = closed_form(logits, ids, 0);
  const DistAttr hd = mesh::parse_dist("S(0),R", 2), wd = mesh::parse_dist("R,S(0)", 2);
  Tensor dloss = Tensor::from<double>({N}, std::vector<double>{0.5, -1.0, 2.0, 0.25, 3.0});
  for (int64_t chunk_rows : {1, 2}) {
    SCOPED_TRACE(chunk_rows);
    Attrs attrs{{"reduction", std::string("none")}, {"ignore_index", int64_t{0}}, {"chunk_bytes", chunk_rows * V * 8}};
    auto outs = run_on_mesh(mesh, {{h, hd}, {w, wd}, {labels, hd}},
                            [&](std::span<const Tensor> t, const KernelContext& ctx) { return run_forward(op, t, attrs, &ctx); });
    expect_blocks(mesh, outs, 0, {Tensor::from<double>({N}, ref.loss), hd}, 1e-12, "loss");
    auto grads = run_on_mesh(mesh, {{h, hd}, {w, wd}, {labels, hd}, {dloss, hd}, {dloss, hd}},
                             [&](std::span<const Tensor> t, const KernelContext& ctx) {
                               return run_backward(op, t.subspan(0, 3), t.subspan(3, 1), t.subspan(4, 1), attrs, &ctx);
                             });
    // dz = (softmax - onehot) * dloss; dh = dz·W (rows of mesh coord 0), dW = dzᵀ·h (vocab block of coord 1).
    Tensor dh(DType::F64, {N, H}), dw(DType::F64, {V, H});
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < V; ++c)
        for (int64_t k = 0; k < H; ++k) {
          double dz = ref.softmax_minus_onehot.at(i * V + c) * dloss.at(i);
          dh.set_at(i * H + k, dh.at(i * H + k) + dz * w.at(c * H + k));
          dw.set_at(c * H + k, dw.at(c * H + k) + dz * h.at(i * H + k));
        }
    std::vector<Tensor> dh_sum(2), dw_sum(3);  // by row block, by vocab block
    for (int64_t r = 0; r < mesh.size(); ++r) {
      auto coords = mesh.coords(r);
      const auto& g = grads[static_cast<size_t>(r)];
      EXPECT_FALSE(g[2].defined());
      for (auto [sum, part] : {std::pair{&dh_sum[static_cast<size_t>(coords[0])], &g[0]},
                               std::pair{&dw_sum[static_cast<size_t>(coords[1])], &g[1]}}) {
        if (!sum->defined()) {
          *sum = part->clone();
          continue;
        }
        for (int64_t i = 0; i < part->numel(); ++i) sum->set_at(i, sum->at(i) + part->at(i));
      }
    }
    for (int64_t r = 0; r < mesh.size(); ++r) {
      auto coords = mesh.coords(r);
      Tensor want_h = local_part(dh, block_of({dh, hd}, mesh, r)), want_w = local_part(dw, block_of({dw, wd}, mesh, r));
      const Tensor& got_h = dh_sum[static_cast<size_t>(coords[0])];
      const Tensor& got_w = dw_sum[static_cast<size_t>(coords[1])];
      ASSERT_EQ(got_h.shape(), want_h.shape());
      ASSERT_EQ(got_w.shape(), want_w.shape());
      for (int64_t i = 0; i < want_h.numel(); ++i) EXPECT_NEAR(got_h.at(i), want_h.at(i), 1e-12) << "dh rank " << r;
      for (int64_t i = 0; i < want_w.numel(); ++i) EXPECT_NEAR(got_w.at(i), want_w.at(i), 1e-12) << "dW rank " << r;
    }
  }
}

}  // namespace
}  // namespace shardwise::ops
