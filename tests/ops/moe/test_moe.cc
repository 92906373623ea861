// The moe family: moe_mlp's kernels against a double-precision per-token reference written here
// (router, top-k, renormalisation, capacity by (slot, token) priority, SwiGLU experts, aux and
// z losses) and against central differences, an expert-parallel run on 4 threads against the
// single-device kernel, its rule's answers derived by hand, its registry entry. (The verifier
// proves the rule on every mesh and placement: tests/verify/test_every_rule.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/ops/op.h"
#include "tests/comm/forwarder.h"
#include "tests/ops/numeric_grad.h"
#include "tests/ops/random_inputs.h"

namespace shardwise::ops {
namespace {

using mesh::parse_dist;
using spmd::TensorSpec;

using testing::random_f64;  // uniform in [-1, 1)

struct Inputs {
  std::vector<Tensor> t;  // x, gate, w1, w3, w2
};
Inputs make_inputs(int64_t n, int64_t d, int64_t e, int64_t f, uint64_t seed) {
  return {{random_f64({n, d}, seed), random_f64({e, d}, seed + 1), random_f64({e, f, d}, seed + 2),
           random_f64({e, f, d}, seed + 3), random_f64({e, d, f}, seed + 4)}};
}

struct Reference {
  std::vector<double> out;
  double aux = 0, z = 0;
  int64_t dropped = 0;
  std::vector<int64_t> expert_tokens;  // assignments per expert, before capacity
};

// The MoE MLP one token and one expert at a time, in double, from the definitions.
Reference reference(const Inputs& in, int64_t k, double capacity_factor, bool normalize, bool sigmoid = false) {
  const Tensor &x = in.t[0], &gate = in.t[1], &w1 = in.t[2], &w3 = in.t[3], &w2 = in.t[4];
  const int64_t n = x.shape()[0], d = x.shape()[1], e = gate.shape()[0], f = w1.shape()[1];
  Reference ref;
  ref.out.assign(static_cast<size_t>(n * d), 0.0);
  std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(n));
  std::vector<std::vector<double>> weight(static_cast<size_t>(n));
  std::vector<double> count(static_cast<size_t>(e), 0.0), psum(static_cast<size_t>(e), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> logit(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) {
      for (int64_t c = 0; c < d; ++c) logit[static_cast<size_t>(i)] += x.at(t * d + c) * gate.at(i * d + c);
    }
    double mx = *std::max_element(logit.begin(), logit.end()), z = 0;
    for (double l : logit) z += std::exp(l - mx);
    std::vector<double> p(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) {
      const double l = logit[static_cast<size_t>(i)];
      p[static_cast<size_t>(i)] = sigmoid ? 1.0 / (1.0 + std::exp(-l)) : std::exp(l - mx) / z;
    }
    const double lse = mx + std::log(z);
    ref.z += lse * lse / static_cast<double>(n);
    std::vector<int64_t> idx(static_cast<size_t>(e));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += p[idx[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = idx[static_cast<size_t>(j)];
      chosen[static_cast<size_t>(t)].push_back(ex);
      weight[static_cast<size_t>(t)].push_back(normalize ? p[ex] / s : p[ex]);
      count[static_cast<size_t>(ex)] += 1;
    }
    for (int64_t i = 0; i < e; ++i) psum[static_cast<size_t>(i)] += p[static_cast<size_t>(i)];
  }
  for (int64_t i = 0; i < e; ++i) ref.expert_tokens.push_back(static_cast<int64_t>(count[static_cast<size_t>(i)]));
  for (int64_t i = 0; i < e; ++i) {
    ref.aux += static_cast<double>(e) * (count[static_cast<size_t>(i)] / n) * (psum[static_cast<size_t>(i)] / n);
  }
  // Capacity: slot 0 of every token, then slot 1, ...; within a slot, token order.
  const auto cap = static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(n * k) / e));
  std::vector<int64_t> used(static_cast<size_t>(e), 0);
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < n; ++t) {
      const int64_t ex = chosen[static_cast<size_t>(t)][static_cast<size_t>(j)];
      if (capacity_factor > 0 && used[static_cast<size_t>(ex)]++ >= cap) {
        ++ref.dropped;
        continue;
      }
      for (int64_t r = 0; r < d; ++r) {
        double y = 0;
        for (int64_t h = 0; h < f; ++h) {
          double a = 0, b = 0;
          for (int64_t c = 0; c < d; ++c) {
            a += w1.at((ex * f + h) * d + c) * x.at(t * d + c);
            b += w3.at((ex * f + h) * d + c) * x.at(t * d + c);
          }
          y += w2.at((ex * d + r) * f + h) * (a / (1 + std::exp(-a))) * b;
        }
        ref.out[static_cast<size_t>(t * d + r)] += weight[static_cast<size_t>(t)][static_cast<size_t>(j)] * y;
      }
    }
  }
  return ref;
}

void expect_matches_reference(const Inputs& in, int64_t k, double cf, bool normalize, bool sigmoid = false) {
  std::vector<Tensor> got = moe_forward(in.t, MoeConfig{k, cf, normalize, sigmoid}, MoeShard{});
  Reference ref = reference(in, k, cf, normalize, sigmoid);
  ASSERT_EQ(got.size(), 5u);
  for (int64_t i = 0; i < got[0].numel(); ++i) {
    EXPECT_NEAR(got[0].at(i), ref.out[static_cast<size_t>(i)], 1e-12) << "out " << i;
  }
  EXPECT_NEAR(got[1].at(0), ref.aux, 1e-12);
  EXPECT_NEAR(got[2].at(0), ref.z, 1e-12);
  EXPECT_EQ(got[3].data<int64_t>()[0], ref.dropped);
  ASSERT_EQ(got[4].numel(), static_cast<int64_t>(ref.expert_tokens.size()));
  for (int64_t i = 0; i < got[4].numel(); ++i) EXPECT_EQ(got[4].data<int64_t>()[i], ref.expert_tokens[static_cast<size_t>(i)]);
}

TEST(MoeKernel, DroplessMatchesPerTokenReference) {
  expect_matches_reference(make_inputs(9, 4, 5, 3, 1), 2, 0.0, true);
  expect_matches_reference(make_inputs(6, 3, 4, 2, 2), 1, 0.0, true);
  expect_matches_reference(make_inputs(7, 3, 4, 5, 3), 3, 0.0, false);  // Qwen-MoE's norm_topk_prob=false
  expect_matches_reference(make_inputs(9, 4, 5, 3, 5), 2, 0.0, true, true);   // sigmoid gating
  expect_matches_reference(make_inputs(9, 4, 5, 3, 6), 2, 0.0, false, true);  // sigmoid, not renormalised
  expect_matches_reference(make_inputs(16, 3, 4, 2, 7), 2, 0.5, true, true);  // sigmoid with drops
}

TEST(MoeKernel, CapacityDropsByPriorityAndCounts) {
  Inputs in = make_inputs(16, 3, 4, 2, 4);
  // C = ceil(0.5 * 16 * 2 / 4) = 4 per expert: 32 assignments, at most 16 kept.
  std::vector<Tensor> got = moe_forward(in.t, MoeConfig{2, 0.5, true}, MoeShard{});
  EXPECT_GE(got[3].data<int64_t>()[0], 16);
  expect_matches_reference(in, 2, 0.5, true);
  expect_matches_reference(in, 2, 1.0, true);
  expect_matches_reference(in, 2, 4.0, true);  // nothing dropped
  EXPECT_EQ(moe_forward(in.t, MoeConfig{2, 4.0, true}, MoeShard{})[3].data<int64_t>()[0], 0);
}

TEST(MoeKernel, BackwardMatchesCentralDifferences) {
  for (auto [cf, sigmoid] : {std::pair{0.0, false}, std::pair{0.75, false}, std::pair{0.0, true}, std::pair{0.75, true}}) {
    Inputs in = make_inputs(6, 3, 4, 2, 10);
    Tensor wout = random_f64({6, 3}, 20);
    const double caux = 0.7, cz = -0.3;
    MoeConfig cfg{2, cf, true, sigmoid};
    MoeGrads g = moe_backward(in.t, wout, Tensor::scalar<double>(caux), Tensor::scalar<double>(cz), cfg, MoeShard{});
    std::vector<Tensor> grads{g.dx, g.dgate, g.dw1, g.dw3, g.dw2};
    for (size_t i = 0; i < 5; ++i) {
      // L = sum(wout * out) + caux * aux + cz * z, as one "output" weighted by 1.
      Tensor one = Tensor::scalar<double>(1.0);
      std::vector<double> num = testing_util::numeric_grad(in.t[i], one, [&] {
        std::vector<Tensor> o = moe_forward(in.t, cfg, MoeShard{});
        double l = caux * o[1].at(0) + cz * o[2].at(0);
        for (int64_t j = 0; j < o[0].numel(); ++j) l += o[0].at(j) * wout.at(j);
        return Tensor::scalar<double>(l);
      });
      for (int64_t j = 0; j < grads[i].numel(); ++j) {
        EXPECT_NEAR(grads[i].at(j), num[static_cast<size_t>(j)], 1e-6) << "cf " << cf << " sigmoid " << sigmoid << " input " << i << " at " << j;
      }
    }
  }
}

// Rank r's blocks of the five inputs under `dists`, their places recorded in ctx.
std::vector<Tensor> local_inputs(const Inputs& in, const std::vector<mesh::DistAttr>& dists, const mesh::ProcessMesh& pm,
                                 int64_t r, KernelContext& ctx) {
  std::vector<Tensor> local;
  for (size_t i = 0; i < 5; ++i) {
    auto block = mesh::local_block(in.t[i].shape(), dists[i], pm, pm.coords(r));
    local.push_back(in.t[i].slice(block.offsets(), block.shape));
    ctx.tensors.push_back({in.t[i].shape(), block.offset, dists[i]});
  }
  return local;
}

// Expert parallelism on 4 threads (mesh [4]): tokens and experts split 4 ways, against one device.
TEST(MoeKernel, ExpertParallelEqualsOneDevice) {
  const OpDef& op = op_registry().get("moe_mlp");
  Inputs in = make_inputs(10, 3, 6, 2, 30);  // 6 experts over 4 ranks: 2, 2, 1, 1
  Tensor wout = random_f64({10, 3}, 31);
  Attrs attrs{{"top_k", int64_t{2}}, {"capacity_factor", 0.75}};
  std::vector<Tensor> want = run_forward(op, in.t, attrs);
  std::vector<Tensor> none{want[0], want[1], want[2], want[3], want[4]};
  std::vector<Tensor> dout{wout, Tensor::scalar<double>(0.5), Tensor::scalar<double>(0.25), Tensor(), Tensor()};
  std::vector<Tensor> want_grad = run_backward(op, in.t, none, dout, attrs);
  ASSERT_GT(want[3].data<int64_t>()[0], 0);
  mesh::ProcessMesh pm(Shape{4});
  std::vector<mesh::DistAttr> dists{parse_dist("S(0)"), parse_dist("R"), parse_dist("S(0)"), parse_dist("S(0)"),
                                    parse_dist("S(0)")};
  std::vector<std::vector<Tensor>> outs(4), grads(4);
  comm::LocalWorld::run(4, [&](comm::Communicator& world) {
    const int r = world.rank();
    comm::MeshComm mc(pm, world.group(world.members()));
    KernelContext ctx;
    ctx.mesh_comm = &mc;
    std::vector<Tensor> local = local_inputs(in, dists, pm, r, ctx);
    outs[static_cast<size_t>(r)] = run_forward(op, local, attrs, &ctx);
    auto ob = mesh::local_block(wout.shape(), dists[0], pm, pm.coords(r));
    std::vector<Tensor> ldout{wout.slice(ob.offsets(), ob.shape), dout[1], dout[2], Tensor(), Tensor()};
    grads[static_cast<size_t>(r)] = run_backward(op, local, outs[static_cast<size_t>(r)], ldout, attrs, &ctx);
  });
  int64_t row = 0, expert = 0;
  std::vector<double> dgate(static_cast<size_t>(want_grad[1].numel()), 0.0);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(outs[r][1].at(0), want[1].at(0));
    EXPECT_EQ(outs[r][3].data<int64_t>()[0], want[3].data<int64_t>()[0]);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(outs[r][4].data<int64_t>()[i], want[4].data<int64_t>()[i]);  // global
    for (int64_t i = 0; i < outs[r][0].numel(); ++i) EXPECT_NEAR(outs[r][0].at(i), want[0].at(row * 3 + i), 1e-12);
    for (int64_t i = 0; i < grads[r][0].numel(); ++i) EXPECT_NEAR(grads[r][0].at(i), want_grad[0].at(row * 3 + i), 1e-12);
    for (int64_t i = 0; i < grads[r][2].numel(); ++i) EXPECT_NEAR(grads[r][2].at(i), want_grad[2].at(expert * 6 + i), 1e-12);
    for (int64_t i = 0; i < grads[r][1].numel(); ++i) dgate[static_cast<size_t>(i)] += grads[r][1].at(i);  // P(sum)
    row += outs[r][0].shape()[0];
    expert += grads[r][2].shape()[0];
  }
  for (int64_t i = 0; i < want_grad[1].numel(); ++i) EXPECT_NEAR(dgate[static_cast<size_t>(i)], want_grad[1].at(i), 1e-12);
}

// The two exchanges of the expert group (MoeExchange) on 4 threads, tokens and experts split
// unevenly: rank 3 holds no tokens (sends nothing), expert 5 is never chosen (receives nothing),
// rank 2's only expert is 5 (empty), capacity drops some rows. Forward and backward give the same
// bits by messages and through the shared regions (the data travel differently, the arithmetic
// is the same), both equal to one device; the shared path is the one that ran (its calls counted
// by shared_regions); a bad SHARDWISE_MOE_EXCHANGE is an Error naming the value.
TEST(MoeKernel, SharedAndMessageExchangesGiveTheSameBits) {
  const int64_t d = 3, f = 2, E = 6;
  Inputs in = make_inputs(11, d, E, f, 60);
  for (int64_t i = 0; i < in.t[0].numel(); ++i) in.t[0].set_at(i, std::abs(in.t[0].at(i)) + 0.1);  // x > 0
  for (int64_t c = 0; c < d; ++c) in.t[1].set_at(5 * d + c, -10.0);  // expert 5's logit far below the others
  Tensor dout = random_f64({11, d}, 61);
  const MoeConfig cfg{2, 0.9, true, false};
  const std::vector<Tensor> want = moe_forward(in.t, cfg, MoeShard{});
  const MoeGrads want_grad = moe_backward(in.t, dout, Tensor::scalar<double>(0.5), Tensor(), cfg, MoeShard{});
  ASSERT_GT(want[3].data<int64_t>()[0], 0);
  ASSERT_EQ(want[4].data<int64_t>()[5], 0);
  const int64_t token_first[5] = {0, 4, 8, 11, 11}, expert_first[5] = {0, 2, 5, 6, 6};  // rank 3: no experts either
  // Rank r's inputs: tokens [t0, t1), experts [e0, e1).
  auto block = [&](int64_t t0, int64_t t1, int64_t e0, int64_t e1) {
    auto experts = [&](const Tensor& t) {
      return t.slice(std::vector<int64_t>{e0, 0, 0}, Shape{e1 - e0, t.shape()[1], t.shape()[2]});
    };
    return std::vector<Tensor>{in.t[0].slice(std::vector<int64_t>{t0, 0}, Shape{t1 - t0, d}), in.t[1],
                               experts(in.t[2]), experts(in.t[3]), experts(in.t[4])};
  };
  auto ranks_block = [&](size_t r) {
    return block(token_first[r], token_first[r + 1], expert_first[r], expert_first[r + 1]);
  };
  std::vector<Tensor> got[2][4];  // [exchange][rank]: out, dx, dgate, dw1, dw2
  int64_t calls[2][4];
  for (int path = 0; path < 2; ++path) {
    const MoeExchange exchange = path == 0 ? MoeExchange::Messages : MoeExchange::Shared;
    comm::LocalWorld::run(4, [&](comm::Communicator& world) {
      const auto r = static_cast<size_t>(world.rank());
      const int64_t t0 = token_first[r], t1 = token_first[r + 1];
      const std::vector<Tensor> mine = ranks_block(r);
      auto rows = [&](const Tensor& t) { return t.slice(std::vector<int64_t>{t0, 0}, Shape{t1 - t0, d}); };
      MoeShard shard{t0, 11, expert_first[r], &world, &world, exchange};
      const int64_t before = world.shared_regions(0).call;
      const std::vector<Tensor> out = moe_forward(mine, cfg, shard);
      const MoeGrads g = moe_backward(mine, rows(dout), Tensor::scalar<double>(0.5), Tensor(), cfg, shard);
      calls[path][r] = world.shared_regions(0).call - before - 1;
      got[path][r] = {out[0], g.dx, g.dgate, g.dw1, g.dw2};
    });
  }
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(calls[0][r], 0) << "rank " << r << ": the message path used the shared regions";
    EXPECT_EQ(calls[1][r], 2) << "rank " << r << ": the shared path did not use the shared regions";
    for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(same_bits(got[0][r][i], got[1][r][i])) << "rank " << r << " output " << i;
    const int64_t t0 = token_first[r], e0 = expert_first[r];
    for (int64_t i = 0; i < got[1][r][0].numel(); ++i) {
      EXPECT_NEAR(got[1][r][0].at(i), want[0].at(t0 * d + i), 1e-12);
      EXPECT_NEAR(got[1][r][1].at(i), want_grad.dx.at(t0 * d + i), 1e-12);
    }
    for (int64_t i = 0; i < got[1][r][3].numel(); ++i) EXPECT_NEAR(got[1][r][3].at(i), want_grad.dw1.at(e0 * f * d + i), 1e-12);
    for (int64_t i = 0; i < got[1][r][4].numel(); ++i) EXPECT_NEAR(got[1][r][4].at(i), want_grad.dw2.at(e0 * d * f + i), 1e-12);
  }
  // A group without shared regions (the base class's default): Auto goes by messages, to the
  // same bits; Shared asked for is an Error naming the group.
  std::string message;
  comm::LocalWorld::run(4, [&](comm::Communicator& world) {
    comm::Forwarder plain(world);
    const auto r = static_cast<size_t>(world.rank());
    const std::vector<Tensor> mine = ranks_block(r);
    const std::vector<Tensor> out = moe_forward(mine, cfg, MoeShard{token_first[r], 11, expert_first[r], &plain, &plain});
    EXPECT_TRUE(same_bits(out[0], got[0][r][0])) << "rank " << r;
    try {
      moe_forward(mine, cfg, MoeShard{token_first[r], 11, expert_first[r], &plain, &plain, MoeExchange::Shared});
    } catch (const Error& e) {
      if (r == 0) message = e.what();
    }
  });
  EXPECT_NE(message.find("the shared-memory exchange was asked for (MoeExchange::Shared or SHARDWISE_MOE_EXCHANGE=shared), "
                         "but the expert group [0,1,2,3] (local backend) has no shared regions"),
            std::string::npos)
      << message;
  message.clear();
  ::setenv("SHARDWISE_MOE_EXCHANGE", "pipes", 1);
  try {
    comm::LocalWorld::run(2, [&](comm::Communicator& world) {
      const int64_t r = world.rank();
      moe_forward(block(r * 5, r * 5 + 5, r * 3, r * 3 + 3), cfg, MoeShard{r * 5, 10, r * 3, &world, &world});
    });
  } catch (const Error& e) {
    message = e.what();
  }
  ::unsetenv("SHARDWISE_MOE_EXCHANGE");
  EXPECT_NE(message.find("SHARDWISE_MOE_EXCHANGE=pipes: the MoE exchange is 'messages' or 'shared'"), std::string::npos)
      << message;
}

// Experts split over a mesh dim that does not split the tokens (a layout the rule never asks for)
// are refused by the kernel, naming both layouts.
TEST(MoeKernel, ExpertsSplitWhereTokensAreNotAreRefused) {
  const OpDef& op = op_registry().get("moe_mlp");
  Inputs in = make_inputs(4, 3, 4, 2, 50);
  mesh::ProcessMesh pm(Shape{2});
  std::vector<mesh::DistAttr> dists{parse_dist("R"), parse_dist("R"), parse_dist("S(0)"), parse_dist("S(0)"),
                                    parse_dist("S(0)")};
  std::string message;
  try {
    comm::LocalWorld::run(2, [&](comm::Communicator& world) {
      comm::MeshComm mc(pm, world.group(world.members()));
      KernelContext ctx;
      ctx.mesh_comm = &mc;
      std::vector<Tensor> local = local_inputs(in, dists, pm, world.rank(), ctx);
      run_forward(op, local, Attrs{{"top_k", int64_t{1}}}, &ctx);
    });
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("split over mesh dim 0 but the tokens are not"), std::string::npos) << message;
}

TEST(MoeKernel, BadInputsNameTheProblem) {
  Inputs in = make_inputs(4, 3, 4, 2, 40);
  const OpDef& op = op_registry().get("moe_mlp");
  auto infer = [&](std::vector<TensorMeta> metas, Attrs attrs) { return infer_checked(op, metas, attrs); };
  std::vector<TensorMeta> good{{{4, 3}, DType::F64}, {{4, 3}, DType::F64}, {{4, 2, 3}, DType::F64},
                               {{4, 2, 3}, DType::F64}, {{4, 3, 2}, DType::F64}};
  EXPECT_NO_THROW(infer(good, Attrs{{"top_k", int64_t{2}}}));
  try {
    infer(good, Attrs{{"top_k", int64_t{5}}});
    FAIL() << "top_k > experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k = 5"), std::string::npos) << e.what();
  }
  auto bad_w2 = good;
  bad_w2[4].shape = Shape{4, 2, 3};
  EXPECT_THROW(infer(bad_w2, Attrs{{"top_k", int64_t{1}}}), Error);
  EXPECT_THROW(infer(good, Attrs{{"top_k", int64_t{1}}, {"capacity_factor", -1.0}}), Error);
  try {
    infer(good, Attrs{{"top_k", int64_t{1}}, {"router", std::string("relu")}});
    FAIL() << "router relu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router 'relu' must be softmax or sigmoid"), std::string::npos) << e.what();
  }
  auto mixed = good;
  mixed[1].dtype = DType::F32;
  EXPECT_THROW(infer(mixed, Attrs{{"top_k", int64_t{1}}}), Error);
}

std::vector<TensorSpec> specs(const char* x, const char* w1) {
  return {{{12, 4}, DType::F64, parse_dist(x)}, {{6, 4}, DType::F64, parse_dist("R,R")},
          {{6, 3, 4}, DType::F64, parse_dist(w1)}, {{6, 3, 4}, DType::F64, parse_dist("R,R")},
          {{6, 4, 3}, DType::F64, parse_dist("R,R")}};
}

TEST(MoeRule, ExpertsShardedWhereTokensAre) {
  const spmd::Rule& rule = op_registry().get("moe_mlp").rule;
  mesh::ProcessMesh pm(Shape{2, 2});
  // ep over the dp ranks: both on mesh dim 0.
  auto r = rule.forward(pm, specs("S(0),R", "S(0),R"), {});
  EXPECT_EQ(r.inputs[0].to_string(), "S(0),R");
  EXPECT_EQ(r.inputs[2].to_string(), "S(0),R");
  EXPECT_EQ(r.inputs[4].to_string(), "S(0),R");  // w2 follows w1
  EXPECT_EQ(r.outputs[0].to_string(), "S(0),R");
  EXPECT_EQ(r.outputs[1].to_string(), "R,R");
  // Experts over mesh dim 1, tokens over dim 0: the tokens are split over dim 1 too.
  r = rule.forward(pm, specs("S(0),R", "R,S(0)"), {});
  EXPECT_EQ(r.inputs[0].to_string(), "S(0),S(0)");
  EXPECT_EQ(r.inputs[2].to_string(), "R,S(0)");
  // Hidden dims and Partials are not kept.
  r = rule.forward(pm, specs("S(1),P(sum)", "S(1),S(2)"), {});
  EXPECT_EQ(r.inputs[0].to_string(), "R,R");
  EXPECT_EQ(r.inputs[2].to_string(), "R,R");
  EXPECT_EQ(r.inputs[1].to_string(), "R,R");
}

TEST(MoeRule, GradientsPartialOverTokenOnlyDims) {
  const spmd::Rule& rule = op_registry().get("moe_mlp").rule;
  mesh::ProcessMesh pm(Shape{2, 2});
  std::vector<TensorSpec> g = specs("S(0),R", "R,S(0)");
  for (int i = 0; i < 2; ++i) {
    g.push_back({{12, 4}, DType::F64, parse_dist("R,R")});
    for (int j = 0; j < 2; ++j) g.push_back({{}, DType::F64, parse_dist("R,R")});
    g.push_back({{}, DType::I64, parse_dist("R,R")});
    g.push_back({{6}, DType::I64, parse_dist("R,R")});
  }
  auto r = rule.grad(pm, g, {});
  EXPECT_EQ(r.inputs[10].to_string(), "S(0),S(0)");       // dout like x
  EXPECT_EQ(r.outputs[0].to_string(), "S(0),S(0)");      // dx
  EXPECT_EQ(r.outputs[1].to_string(), "P(sum),P(sum)");  // dgate
  EXPECT_EQ(r.outputs[2].to_string(), "P(sum),S(0)");    // dw1: experts over dim 1, tokens only over dim 0
}

}  // namespace
}  // namespace shardwise::ops
