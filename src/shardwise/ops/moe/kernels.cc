// The MoE MLP's forward and backward: dispatch by all_to_all_v, grouped expert GEMMs, combine.
#include "shardwise/ops/moe/kernels.h"

#include <cmath>
#include <utility>

#include "shardwise/core/error.h"
#include "shardwise/ops/sigmoid.h"
#include "shardwise/ops/moe/dispatch.h"
#include "shardwise/ops/moe/routing.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise::ops {

using moe_detail::DispatchPlan;
using moe_detail::Routing;

namespace {

template <class T>
T silu_of(T v) {
  return v * sigmoid_of(v);
}

// v's values rounded to bf16, held in T: the operand a bf16 GEMM reads (bf16 inputs only, T float).
template <class T>
void round_to_bf16(std::vector<T>& v) {
  for (T& e : v) e = static_cast<T>(static_cast<float>(bf16(static_cast<float>(e))));
}

// C [m, n] (= or +=) op(A) op(B) with packed row-major operands.
template <class T>
void mm(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k, bool ta, bool tb, double beta = 0.0) {
  gemm<T>(gemm_args(ta, tb, m, n, k, beta), a, b, c);
}

struct ExpertDims {
  int64_t d = 0, f = 0;
};

// One expert's hidden activations on its m rows: h1 = X w1^T, h3 = X w3^T, a = silu(h1) * h3.
template <class T>
void expert_hidden(const T* x, const T* w1, const T* w3, int64_t m, ExpertDims dm, std::vector<T>& h1,
                   std::vector<T>& h3, std::vector<T>& a) {
  const auto mf = static_cast<size_t>(m * dm.f);
  h1.resize(mf);
  h3.resize(mf);
  a.resize(mf);
  mm<T>(x, w1, h1.data(), m, dm.f, dm.d, false, true);
  mm<T>(x, w3, h3.data(), m, dm.f, dm.d, false, true);
  for (size_t i = 0; i < mf; ++i) a[i] = silu_of(h1[i]) * h3[i];
}

// Runs every local expert on its rows (expert-major, rows of `d`): y = a w2^T, written over the
// expert's rows once its two input GEMMs have read them.
template <class T>
void experts_forward(const DispatchPlan& plan, T* rows, const Tensor& w1, const Tensor& w3, const Tensor& w2,
                     ExpertDims dm, bool bf16_operands) {
  std::vector<T> h1, h3, a;
  int64_t row = 0;
  for (int64_t j = 0; j < plan.local_experts; ++j) {
    const int64_t m = plan.expert_rows[static_cast<size_t>(j)];
    if (m == 0) continue;  // an empty expert costs nothing
    const int64_t wo = j * dm.f * dm.d;
    expert_hidden<T>(rows + row * dm.d, w1.data<T>() + wo, w3.data<T>() + wo, m, dm, h1, h3, a);
    if (bf16_operands) round_to_bf16(a);
    mm<T>(a.data(), w2.data<T>() + wo, rows + row * dm.d, m, dm.d, dm.f, false, true);
    row += m;
  }
}

template <class T>
std::vector<Tensor> forward_typed(std::span<const Tensor> in, const MoeConfig& cfg, const MoeShard& shard,
                                  bool bf16_operands) {
  const Tensor& x = in[0];
  const ExpertDims dm{x.shape()[1], in[2].shape()[1]};
  Routing r = moe_detail::route(x, in[1], in[2].shape()[0], cfg, shard);
  DispatchPlan plan = moe_detail::plan_dispatch(r, in[2].shape()[0], shard);
  moe_detail::RowExchange<T> exchange(shard.expert_group, plan, shard.exchange, dm.d, dm.d, shard.moves);
  T* rows = exchange.dispatch([&](int64_t i, T* dst) {
    const T* src = x.data<T>() + (plan.order[static_cast<size_t>(i)] / r.top_k) * dm.d;
    std::copy(src, src + dm.d, dst);
  });
  experts_forward<T>(plan, rows, in[2], in[3], in[4], dm, bf16_operands);
  const std::vector<const T*> back = exchange.combine();
  // Combine in slot order per token, whatever the send order.
  std::vector<int64_t> pos(r.expert.size(), -1);
  for (size_t i = 0; i < plan.order.size(); ++i) pos[static_cast<size_t>(plan.order[i])] = static_cast<int64_t>(i);
  Tensor out = Tensor::full(x.dtype(), x.shape(), 0.0);
  std::vector<double> acc(static_cast<size_t>(dm.d));
  for (int64_t t = 0; t < r.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto a = static_cast<size_t>(t * r.top_k + s);
      if (pos[a] < 0) continue;
      const T* yr = back[static_cast<size_t>(pos[a])];
      for (int64_t c = 0; c < dm.d; ++c) acc[static_cast<size_t>(c)] += r.weight[a] * static_cast<double>(yr[c]);
    }
    T* o = out.data<T>() + t * dm.d;
    for (int64_t c = 0; c < dm.d; ++c) o[c] = static_cast<T>(acc[static_cast<size_t>(c)]);
  }
  Tensor expert_tokens(DType::I64, Shape{r.experts});
  for (int64_t e = 0; e < r.experts; ++e) {
    expert_tokens.data<int64_t>()[e] = static_cast<int64_t>(r.count_total[static_cast<size_t>(e)]);
  }
  return {out, Tensor::scalar<T>(static_cast<T>(moe_detail::aux_loss_of(r))),
          Tensor::scalar<T>(static_cast<T>(moe_detail::z_loss_of(r))), Tensor::scalar<int64_t>(r.dropped),
          expert_tokens};
}

// Rows [x | dout | weight] in (width 2d + 1); rows [dx | dweight] out (width d + 1), packed over
// the same buffer (an expert's results are written after its rows were read, and never reach a
// later expert's rows: out row i ends before in row i does); the weight gradients of the local
// experts accumulated into g.
template <class T>
void experts_backward(const DispatchPlan& plan, T* rows, std::span<const Tensor> in, ExpertDims dm, MoeGrads& g,
                      bool bf16_operands) {
  const int64_t win = 2 * dm.d + 1, wout = dm.d + 1;
  T* out = rows;
  std::vector<T> x, dout, h1, h3, a, y, dy, da, dh1, dh3, dx;
  int64_t row = 0;
  for (int64_t j = 0; j < plan.local_experts; ++j) {
    const int64_t m = plan.expert_rows[static_cast<size_t>(j)];
    if (m == 0) continue;
    const auto md = static_cast<size_t>(m * dm.d), mf = static_cast<size_t>(m * dm.f);
    x.resize(md), dout.resize(md), y.resize(md), dy.resize(md), dx.resize(md);
    for (int64_t i = 0; i < m; ++i) {
      const T* rw = rows + (row + i) * win;
      std::copy(rw, rw + dm.d, x.data() + i * dm.d);
      for (int64_t c = 0; c < dm.d; ++c) {
        dout[static_cast<size_t>(i * dm.d + c)] = rw[dm.d + c];
        dy[static_cast<size_t>(i * dm.d + c)] = rw[dm.d + c] * rw[2 * dm.d];
      }
    }
    const int64_t wo = j * dm.f * dm.d;
    const T *w1 = in[2].data<T>() + wo, *w3 = in[3].data<T>() + wo, *w2 = in[4].data<T>() + wo;
    expert_hidden<T>(x.data(), w1, w3, m, dm, h1, h3, a);
    if (bf16_operands) round_to_bf16(a), round_to_bf16(dy);
    mm<T>(a.data(), w2, y.data(), m, dm.d, dm.f, false, true);
    da.resize(mf), dh1.resize(mf), dh3.resize(mf);
    mm<T>(dy.data(), w2, da.data(), m, dm.f, dm.d, false, false);                      // da = dy w2
    mm<T>(dy.data(), a.data(), g.dw2.data<T>() + wo, dm.d, dm.f, m, true, false, 1.0);  // dw2 += dy^T a
    for (size_t i = 0; i < mf; ++i) {
      const T s = sigmoid_of(h1[i]);
      dh1[i] = da[i] * h3[i] * (s * (T(1) + h1[i] * (T(1) - s)));
      dh3[i] = da[i] * h1[i] * s;
    }
    if (bf16_operands) round_to_bf16(dh1), round_to_bf16(dh3);
    mm<T>(dh1.data(), x.data(), g.dw1.data<T>() + wo, dm.f, dm.d, m, true, false, 1.0);  // dw1 += dh1^T x
    mm<T>(dh3.data(), x.data(), g.dw3.data<T>() + wo, dm.f, dm.d, m, true, false, 1.0);  // dw3 += dh3^T x
    mm<T>(dh1.data(), w1, dx.data(), m, dm.d, dm.f, false, false);                       // dx = dh1 w1
    mm<T>(dh3.data(), w3, dx.data(), m, dm.d, dm.f, false, false, 1.0);                  //    + dh3 w3
    for (int64_t i = 0; i < m; ++i) {
      T* o = out + (row + i) * wout;
      double gw = 0;
      for (int64_t c = 0; c < dm.d; ++c) {
        o[c] = dx[static_cast<size_t>(i * dm.d + c)];
        gw += static_cast<double>(dout[static_cast<size_t>(i * dm.d + c)]) * static_cast<double>(y[static_cast<size_t>(i * dm.d + c)]);
      }
      o[dm.d] = static_cast<T>(gw);
    }
    row += m;
  }
}

// The router's gradient: dlogits from the gate-weight gradients dweight [tokens * top_k], the aux
// loss and the z-loss; then dgate += dlogits^T x and dx += dlogits gate (double accumulators).
template <class T>
void router_backward(const Routing& r, const std::vector<double>& dweight, double daux, double dz, const MoeConfig& cfg,
                     std::span<const Tensor> in, std::vector<double>& dx, MoeGrads& g) {
  const int64_t d = in[0].shape()[1], E = r.experts;
  const T *xs = in[0].data<T>(), *gs = in[1].data<T>();
  std::vector<double> dgate(static_cast<size_t>(E * d), 0.0), dp(static_cast<size_t>(E)), dl(static_cast<size_t>(E));
  const double n = static_cast<double>(r.tokens_total);
  for (int64_t t = 0; t < r.tokens; ++t) {
    const double* p = &r.probs[static_cast<size_t>(t * E)];
    for (int64_t e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = daux * static_cast<double>(E) * r.count_total[static_cast<size_t>(e)] / (n * n);
    double sum = 0, gp = 0;
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto a = static_cast<size_t>(t * r.top_k + s);
      sum += p[r.expert[a]];
      gp += dweight[a] * p[r.expert[a]];
    }
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto a = static_cast<size_t>(t * r.top_k + s);
      dp[static_cast<size_t>(r.expert[a])] += cfg.normalize ? dweight[a] / sum - gp / (sum * sum) : dweight[a];
    }
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[static_cast<size_t>(e)];
    const double zt = dz * 2.0 * r.lse[static_cast<size_t>(t)] / n;
    const double* logit = &r.logits[static_cast<size_t>(t * E)];
    for (int64_t e = 0; e < E; ++e) {
      const double softmax = std::exp(logit[e] - r.lse[static_cast<size_t>(t)]);  // d lse / d logit
      const double dscore = cfg.sigmoid ? p[e] * (1.0 - p[e]) * dp[static_cast<size_t>(e)]
                                        : p[e] * (dp[static_cast<size_t>(e)] - dot);
      dl[static_cast<size_t>(e)] = dscore + zt * softmax;
    }
    for (int64_t e = 0; e < E; ++e) {
      const double v = dl[static_cast<size_t>(e)];
      for (int64_t c = 0; c < d; ++c) {
        dgate[static_cast<size_t>(e * d + c)] += v * static_cast<double>(xs[t * d + c]);
        dx[static_cast<size_t>(t * d + c)] += v * static_cast<double>(gs[e * d + c]);
      }
    }
  }
  T* og = g.dgate.data<T>();
  for (size_t i = 0; i < dgate.size(); ++i) og[i] = static_cast<T>(dgate[i]);
}

double scalar_of(const Tensor& t) {
  if (!t.defined()) return 0.0;
  return t.dtype() == DType::F32 ? static_cast<double>(t.data<float>()[0]) : t.data<double>()[0];
}

template <class T>
MoeGrads backward_typed(std::span<const Tensor> in, const Tensor& dout, double daux, double dz, const MoeConfig& cfg,
                        const MoeShard& shard, bool bf16_operands) {
  const Tensor& x = in[0];
  const ExpertDims dm{x.shape()[1], in[2].shape()[1]};
  Routing r = moe_detail::route(x, in[1], in[2].shape()[0], cfg, shard);
  DispatchPlan plan = moe_detail::plan_dispatch(r, in[2].shape()[0], shard);
  MoeGrads g;
  g.dgate = Tensor::full(x.dtype(), in[1].shape(), 0.0);
  g.dw1 = Tensor::full(x.dtype(), in[2].shape(), 0.0);
  g.dw3 = Tensor::full(x.dtype(), in[3].shape(), 0.0);
  g.dw2 = Tensor::full(x.dtype(), in[4].shape(), 0.0);
  const int64_t win = 2 * dm.d + 1, wout = dm.d + 1;
  moe_detail::RowExchange<T> exchange(shard.expert_group, plan, shard.exchange, win, wout, shard.moves);
  T* rows = exchange.dispatch([&](int64_t i, T* row) {
    const int64_t a = plan.order[static_cast<size_t>(i)], t = a / r.top_k;
    std::copy(x.data<T>() + t * dm.d, x.data<T>() + (t + 1) * dm.d, row);
    std::copy(dout.data<T>() + t * dm.d, dout.data<T>() + (t + 1) * dm.d, row + dm.d);
    row[2 * dm.d] = static_cast<T>(r.weight[static_cast<size_t>(a)]);
  });
  experts_backward<T>(plan, rows, in, dm, g, bf16_operands);
  const std::vector<const T*> back = exchange.combine();
  std::vector<int64_t> pos(r.expert.size(), -1);
  for (size_t i = 0; i < plan.order.size(); ++i) pos[static_cast<size_t>(plan.order[i])] = static_cast<int64_t>(i);
  std::vector<double> dx(static_cast<size_t>(r.tokens * dm.d), 0.0), dweight(r.expert.size(), 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t s = 0; s < r.top_k; ++s) {
      const auto a = static_cast<size_t>(t * r.top_k + s);
      if (pos[a] < 0) continue;
      const T* br = back[static_cast<size_t>(pos[a])];
      for (int64_t c = 0; c < dm.d; ++c) dx[static_cast<size_t>(t * dm.d + c)] += static_cast<double>(br[c]);
      dweight[a] = static_cast<double>(br[dm.d]);
    }
  }
  router_backward<T>(r, dweight, daux, dz, cfg, in, dx, g);
  g.dx = Tensor::uninitialized(x.dtype(), x.shape());
  for (size_t i = 0; i < dx.size(); ++i) g.dx.data<T>()[i] = static_cast<T>(dx[i]);
  return g;
}

void check_local(std::span<const Tensor> in, const MoeShard& shard) {
  SW_CHECK(in.size() == 5, "moe_mlp: takes 5 inputs (x, gate, w1, w3, w2), got {}", in.size());
  const int64_t experts = in[1].shape().ndim() == 2 ? in[1].shape()[0] : 0;
  SW_CHECK(shard.expert_offset >= 0 && in[2].shape().ndim() == 3 && shard.expert_offset + in[2].shape()[0] <= experts,
           "moe_mlp: the local experts [{}, +{}) are not within the gate's {} experts", shard.expert_offset,
           in[2].shape().ndim() == 3 ? in[2].shape()[0] : -1, experts);
}

// bf16 inputs (x, w1, w3, w2; the gate is f32) widened to f32: exact.
std::vector<Tensor> widened(std::span<const Tensor> in) {
  std::vector<Tensor> out(in.begin(), in.end());
  for (Tensor& t : out) {
    if (t.dtype() == DType::BF16) t = t.to(DType::F32);
  }
  return out;
}

}  // namespace

std::vector<Tensor> moe_forward(std::span<const Tensor> in, const MoeConfig& cfg, const MoeShard& shard) {
  check_local(in, shard);
  if (in[0].dtype() == DType::BF16) return forward_typed<float>(widened(in), cfg, shard, true);
  if (in[0].dtype() == DType::F32) return forward_typed<float>(in, cfg, shard, false);
  return forward_typed<double>(in, cfg, shard, false);
}

MoeGrads moe_backward(std::span<const Tensor> in, const Tensor& dout, const Tensor& daux, const Tensor& dz,
                      const MoeConfig& cfg, const MoeShard& shard) {
  check_local(in, shard);
  const DType out_dtype = moe_output_dtype(in[0].dtype());
  SW_CHECK(dout.defined() && dout.shape() == in[0].shape() && dout.dtype() == out_dtype,
           "moe_mlp: the output gradient must be {} {} (out's dtype and x's shape)", dtype_name(out_dtype),
           in[0].shape().to_string());
  if (in[0].dtype() == DType::BF16) {
    MoeGrads g = backward_typed<float>(widened(in), dout, scalar_of(daux), scalar_of(dz), cfg, shard, true);
    for (Tensor* t : {&g.dx, &g.dw1, &g.dw3, &g.dw2}) *t = t->to(DType::BF16);  // rounded once; dgate stays f32
    return g;
  }
  if (in[0].dtype() == DType::F32) {
    return backward_typed<float>(in, dout, scalar_of(daux), scalar_of(dz), cfg, shard, false);
  }
  return backward_typed<double>(in, dout, scalar_of(daux), scalar_of(dz), cfg, shard, false);
}

}  // namespace shardwise::ops
