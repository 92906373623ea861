// The MoE routing and dispatch (cuda/moe.h) against ops/moe: the router's decisions against
// moe_detail::route and plan_dispatch (ties, capacity drops, sigmoid gating), and the whole layer
// against ops::moe_forward / moe_backward, with the experts' SwiGLU between gather and combine
// computed here on the host in double (the GEMMs are cuBLASLt's, not these kernels'); the block's
// row of the router's sums that ranks all-gather against the CPU router's. Run twice,
// the same bits. Skipped, with the reason, where no GPU is present.
#include "cuda_test_util.h"

#include <cmath>

#include "shardwise/cuda/layers/moe.h"
#include "shardwise/ops/moe/kernels.h"
#include "shardwise/ops/moe/routing.h"

namespace shardwise::cuda_test {
namespace {

using CudaMoe = Gpu;

struct Layer {
  int64_t N = 37, d = 16, F = 24, E = 5;
  Tensor x, gate, w1, w3, w2;
};

Layer layer(bool tie) {
  Layer l;
  l.x = random_f32(Shape{l.N, l.d}, 91, -1.f, 1.f);
  l.gate = random_f32(Shape{l.E, l.d}, 92, -1.f, 1.f);
  if (tie)  // experts 1 and 3 score alike on every token: the lower index wins on both sides
    for (int64_t c = 0; c < l.d; ++c) l.gate.data<float>()[3 * l.d + c] = l.gate.data<float>()[1 * l.d + c];
  l.w1 = random_f32(Shape{l.E, l.F, l.d}, 93, -0.5f, 0.5f);
  l.w3 = random_f32(Shape{l.E, l.F, l.d}, 94, -0.5f, 0.5f);
  l.w2 = random_f32(Shape{l.E, l.d, l.F}, 95, -0.5f, 0.5f);
  return l;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// Expert e's SwiGLU on its rows (host, double): forward y, or backward dx from dy (backward true).
void expert_rows_of(const Layer& l, int64_t e, const float* x, const float* dy, float* out, int64_t m, bool backward) {
  const float *w1 = l.w1.data<float>() + e * l.F * l.d, *w3 = l.w3.data<float>() + e * l.F * l.d,
              *w2 = l.w2.data<float>() + e * l.d * l.F;
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> h1(static_cast<size_t>(l.F)), h3(h1), dh1(h1), dh3(h1);
    for (int64_t f = 0; f < l.F; ++f)
      for (int64_t c = 0; c < l.d; ++c) {
        h1[static_cast<size_t>(f)] += double(x[i * l.d + c]) * w1[f * l.d + c];
        h3[static_cast<size_t>(f)] += double(x[i * l.d + c]) * w3[f * l.d + c];
      }
    for (int64_t f = 0; f < l.F; ++f) {
      const auto u = static_cast<size_t>(f);
      double da = 0;
      for (int64_t c = 0; c < l.d && backward; ++c) da += double(dy[i * l.d + c]) * w2[c * l.F + f];
      const double s = sigmoid(h1[u]);
      dh1[u] = da * h3[u] * s * (1 + h1[u] * (1 - s));
      dh3[u] = da * silu(h1[u]);
    }
    for (int64_t c = 0; c < l.d; ++c) {
      double v = 0;
      for (int64_t f = 0; f < l.F; ++f) {
        const auto u = static_cast<size_t>(f);
        v += backward ? dh1[u] * w1[f * l.d + c] + dh3[u] * w3[f * l.d + c] : silu(h1[u]) * h3[u] * w2[c * l.F + f];
      }
      out[i * l.d + c] = static_cast<float>(v);
    }
  }
}

// Every expert over its rows of x (host, expert-major, expert_rows each); dy: the output
// gradient (backward) or undefined (forward).
Tensor host_experts(const Layer& l, const std::vector<int64_t>& expert_rows, const Tensor& x, const Tensor& dy) {
  const bool backward = dy.defined();
  Tensor out(DType::F32, x.shape());
  int64_t at = 0;
  for (int64_t e = 0; e < l.E; ++e) {
    const int64_t m = expert_rows[static_cast<size_t>(e)];
    expert_rows_of(l, e, x.data<float>() + at * l.d, backward ? dy.data<float>() + at * l.d : nullptr,
                   out.data<float>() + at * l.d, m, backward);
    at += m;
  }
  return out;
}
Tensor experts(const Layer& l, const cuda::MoeDispatch& d, const Tensor& rows, const Tensor& dy) {
  return to_device(host_experts(l, d.expert_rows, to_host(rows), dy.defined() ? to_host(dy) : Tensor()), kGpu);
}

// The reference itself: routed by the CPU router, the host experts and the combine's formula give
// ops::moe_forward's output (so a GPU mismatch is the kernels', not this file's). Runs everywhere.
TEST(CudaMoeReference, HostExpertsAndCombineReproduceTheCpuOp) {
  const Layer l = layer(false);
  const ops::MoeConfig cfg{2, 0.5, true, false};
  const ops::moe_detail::Routing r = ops::moe_detail::route(l.x, l.gate, l.E, cfg, {});
  const ops::moe_detail::DispatchPlan plan = ops::moe_detail::plan_dispatch(r, l.E, {});
  const auto rows = static_cast<int64_t>(plan.order.size());
  Tensor x_rows(DType::F32, Shape{rows, l.d});
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < l.d; ++c)
      x_rows.data<float>()[i * l.d + c] = l.x.data<float>()[(plan.order[static_cast<size_t>(i)] / 2) * l.d + c];
  const Tensor y = host_experts(l, plan.expert_rows, x_rows, Tensor());
  std::vector<double> out(static_cast<size_t>(l.N * l.d), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t a = plan.order[static_cast<size_t>(i)];
    for (int64_t c = 0; c < l.d; ++c)
      out[static_cast<size_t>((a / 2) * l.d + c)] += r.weight[static_cast<size_t>(a)] * y.data<float>()[i * l.d + c];
  }
  const std::vector<Tensor> ref = ops::moe_forward(std::vector<Tensor>{l.x, l.gate, l.w1, l.w3, l.w2}, cfg, {});
  const CompareResult c = compare(Tensor::from<double>(Shape{l.N, l.d}, out).to(DType::F32), ref[0], 1e-5, 1e-6);
  EXPECT_TRUE(c.equal) << c.message;
  EXPECT_GT(r.dropped, 0);  // capacity 0.5 drops some: the reference covers dropped slots
}

// The host experts' backward is their forward's gradient: sum(y(x) * g) by central differences.
TEST(CudaMoeReference, HostExpertBackwardIsTheForwardsGradient) {
  const Layer l = layer(false);
  const std::vector<int64_t> rows{2, 0, 1, 0, 0};
  const Tensor x = random_f32(Shape{3, l.d}, 97, -1.f, 1.f), g = random_f32(Shape{3, l.d}, 98);
  const Tensor dx = host_experts(l, rows, x, g);
  auto loss = [&](const Tensor& at) {
    const Tensor y = host_experts(l, rows, at, Tensor());
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += double(y.data<float>()[i]) * g.data<float>()[i];
    return s;
  };
  for (int64_t i : {0, 5, 17, 40}) {
    Tensor hi = x.clone(), lo = x.clone();
    hi.data<float>()[i] += 1e-2f;
    lo.data<float>()[i] -= 1e-2f;
    const double fd = (loss(hi) - loss(lo)) / (double(hi.data<float>()[i]) - lo.data<float>()[i]);
    EXPECT_NEAR(dx.data<float>()[i], fd, 1e-3 + 1e-3 * std::abs(fd)) << "element " << i;
  }
}

void check_routing(const Layer& l, const cuda::MoeRouterConfig& c, const std::string& what) {
  const ops::MoeConfig cfg{c.top_k, c.capacity_factor, c.normalize, c.sigmoid};
  const ops::moe_detail::Routing ref = ops::moe_detail::route(l.x, l.gate, l.E, cfg, {});
  const ops::moe_detail::DispatchPlan plan = ops::moe_detail::plan_dispatch(ref, l.E, {});
  const cuda::MoeRouting r = cuda::moe_route(to_device(l.x, kGpu), to_device(l.gate, kGpu), c);
  const Shape nk{l.N, c.top_k};
  expect_close(r.probs, Tensor::from<double>(Shape{l.N, l.E}, ref.probs), 1e-12, 1e-15, what + " probs");
  expect_close(r.lse, Tensor::from<double>(Shape{l.N}, ref.lse), 1e-12, 1e-15, what + " lse");
  expect_close(r.expert, Tensor::from<int64_t>(nk, ref.expert), 0, 0, what + " experts");
  expect_close(r.weight, Tensor::from<double>(nk, ref.weight), 1e-12, 1e-15, what + " weights");
  expect_close(r.kept, Tensor::from<uint8_t>(nk, ref.kept), 0, 0, what + " kept");
  std::vector<int64_t> counts(ref.count_total.begin(), ref.count_total.end());
  expect_close(r.expert_tokens, Tensor::from<int64_t>(Shape{l.E}, counts), 0, 0, what + " expert_tokens");
  expect_close(r.dropped, Tensor::scalar<int64_t>(ref.dropped), 0, 0, what + " dropped");
  expect_close(r.aux_loss, Tensor::scalar<float>(static_cast<float>(ops::moe_detail::aux_loss_of(ref))), 1e-6, 0,
               what + " aux_loss");
  expect_close(r.z_loss, Tensor::scalar<float>(static_cast<float>(ops::moe_detail::z_loss_of(ref))), 1e-6, 0,
               what + " z_loss");
  const cuda::MoeDispatch d = cuda::moe_plan(r);
  std::vector<int64_t> pos(ref.expert.size(), -1);
  for (size_t i = 0; i < plan.order.size(); ++i) pos[static_cast<size_t>(plan.order[i])] = static_cast<int64_t>(i);
  expect_close(d.pos, Tensor::from<int64_t>(nk, pos), 0, 0, what + " rows");
  EXPECT_EQ(d.expert_rows, plan.expert_rows) << what;
}

TEST_F(CudaMoe, RoutingAndPlanEqualTheCpuRouter) {
  check_routing(layer(false), {.top_k = 2}, "softmax top-2");
  check_routing(layer(true), {.top_k = 2}, "softmax top-2, tied experts");
  check_routing(layer(false), {.top_k = 2, .capacity_factor = 0.5}, "capacity 0.5");
  check_routing(layer(false), {.top_k = 3, .normalize = false, .sigmoid = true}, "sigmoid top-3 unnormalised");
}

// The layer: GPU routing, gather, host experts, GPU combine; backward likewise; against the CPU op.
void check_layer(const Layer& l, const cuda::MoeRouterConfig& c, const std::string& what) {
  const ops::MoeConfig cfg{c.top_k, c.capacity_factor, c.normalize, c.sigmoid};
  const std::vector<Tensor> in{l.x, l.gate, l.w1, l.w3, l.w2};
  const std::vector<Tensor> ref = ops::moe_forward(in, cfg, {});
  const Tensor dout = random_f32(Shape{l.N, l.d}, 96), daux = Tensor::scalar<float>(0.3f), dz = Tensor::scalar<float>(0.7f);
  const ops::MoeGrads grads = ops::moe_backward(in, dout, daux, dz, cfg, {});
  const Tensor gx = to_device(l.x, kGpu), ggate = to_device(l.gate, kGpu), gdout = to_device(dout, kGpu);
  const cuda::MoeRouting r = cuda::moe_route(gx, ggate, c);
  const cuda::MoeDispatch d = cuda::moe_plan(r);
  const Tensor rows = cuda::moe_gather(gx, d);
  const Tensor y = experts(l, d, rows, Tensor());
  const Tensor out = cuda::moe_combine(y, d, r);
  expect_close(out, ref[0], 1e-5, 1e-6, what + " out");
  const cuda::MoeCombineGrad cg = cuda::moe_combine_backward(gdout, y, d, r);
  const Tensor dx_rows = experts(l, d, rows, cg.dy);
  const cuda::MoeRouterGradResult g =
      cuda::moe_router_backward(gx, ggate, r, d, dx_rows, cg.dweight, to_device(daux, kGpu), to_device(dz, kGpu));
  expect_close(g.dx, grads.dx, 1e-5, 1e-6, what + " dx");
  expect_close(g.dgate, grads.dgate, 1e-5, 1e-6, what + " dgate");
  const cuda::MoeRouterGradResult again =
      cuda::moe_router_backward(gx, ggate, r, d, dx_rows, cg.dweight, to_device(daux, kGpu), to_device(dz, kGpu));
  EXPECT_TRUE(bit_equal(g.dx, again.dx) && bit_equal(g.dgate, again.dgate)) << what << ": not deterministic";
  EXPECT_TRUE(bit_equal(out, cuda::moe_combine(y, d, r))) << what << ": combine not deterministic";
}

TEST_F(CudaMoe, TheLayerWithHostExpertsEqualsTheCpuOpForwardAndBackward) {
  check_layer(layer(false), {.top_k = 2}, "softmax top-2");
  check_layer(layer(false), {.top_k = 2, .capacity_factor = 0.5}, "capacity 0.5");
  check_layer(layer(false), {.top_k = 3, .normalize = false, .sigmoid = true}, "sigmoid top-3 unnormalised");
}

// The block's row of the router's sums that the ranks all-gather (cuda_ops/moe_ranks.h): the CPU
// router's row (moe_detail::route on one rank keeps its own row in block_sums), counts exactly,
// the f64 sums of p and lse^2 to 1e-12 (the GPU's probabilities are the CPU's to that).
TEST_F(CudaMoe, TheBlockSumsAreTheCpuRoutersRow) {
  const Layer l = layer(false);
  ops::MoeShard shard;
  shard.token_offset = 7, shard.expert_offset = 1;
  const ops::moe_detail::Routing ref = ops::moe_detail::route(l.x, l.gate, 3, ops::MoeConfig{2, 0.0, true, false}, shard);
  const cuda::MoeRouting r = cuda::moe_route(to_device(l.x, kGpu), to_device(l.gate, kGpu), {.top_k = 2});
  const Tensor got = to_host(cuda::moe_block_sums(r, 7, 1, 3));
  ASSERT_EQ(static_cast<size_t>(got.numel()), ref.block_sums.size());
  const size_t counts_end = 3 + static_cast<size_t>(2 * l.E);
  for (size_t i = 0; i < ref.block_sums.size(); ++i) {
    if (i < counts_end) EXPECT_EQ(got.data<double>()[i], ref.block_sums[i]) << "value " << i;
    else EXPECT_NEAR(got.data<double>()[i], ref.block_sums[i], 1e-12 * std::abs(ref.block_sums[i]) + 1e-12) << "value " << i;
  }
}

TEST_F(CudaMoe, TopKOutsideTheExpertsIsAnError) {
  const Layer l = layer(false);
  EXPECT_THROW(cuda::moe_route(to_device(l.x, kGpu), to_device(l.gate, kGpu), {.top_k = 6}), Error);
}

}  // namespace
}  // namespace shardwise::cuda_test
