#include "shardwise/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::train {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return floor;
  double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  double progress = static_cast<double>(step - warmup) / span;
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

void AdamW::step(std::vector<ParamState>& params, const std::vector<Tensor>& grads, double lr, int64_t step) const {
  SW_CHECK(params.size() == grads.size(), "AdamW: {} parameters but {} gradients", params.size(), grads.size());
  SW_CHECK(step >= 1, "AdamW: steps count from 1, got {}", step);
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState& p = params[i];
    const Tensor& g = grads[i];
    SW_CHECK(g.dtype() == DType::F32 && g.shape() == p.master.shape(), "AdamW: the gradient of '{}' is {} {}, expected f32 {}",
             p.name, dtype_name(g.dtype()), g.shape().to_string(), p.master.shape().to_string());
    float* w = p.master.data<float>();
    update(w, p.exp_avg.data<float>(), p.exp_avg_sq.data<float>(), g.data<float>(), p.master.numel(), p.decay, lr, step);
    if (p.param.dtype() == DType::F32) {
      if (p.param.raw() != p.master.raw()) std::copy(w, w + p.master.numel(), p.param.data<float>());
    } else {
      p.param = p.master.to(p.param.dtype());
    }
  }
}

void AdamW::update(float* w, float* m, float* v, const float* gr, int64_t n, bool decay_on, double lr,
                   int64_t step) const {
  const double bc1 = 1.0 - std::pow(c_.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c_.beta2, static_cast<double>(step));
  const float b1 = static_cast<float>(c_.beta1), b2 = static_cast<float>(c_.beta2);
  const float step_size = static_cast<float>(lr / bc1), inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(c_.epsilon);
  const float decay = decay_on ? static_cast<float>(1.0 - lr * c_.weight_decay) : 1.0f;
  parallel_for(n, kParallelGrain / 4, [&](int64_t b, int64_t e) {  // elementwise: any split gives the same bits
    for (int64_t j = b; j < e; ++j) {
      m[j] = b1 * m[j] + (1.0f - b1) * gr[j];
      v[j] = b2 * v[j] + (1.0f - b2) * gr[j] * gr[j];
      w[j] = w[j] * decay - step_size * m[j] / (std::sqrt(v[j]) * inv_bc2_sqrt + eps);
    }
  });
}

namespace {

// Squares summed in double over fixed blocks of kNormBlock elements, the blocks' sums added in
// block order: the same bits on any thread count. A gradient of at most one block is summed in one
// loop, as before the blocks existed; a larger one's sum differs from that loop's by double rounding.
double sum_of_squares(const float* g, int64_t n) {
  constexpr int64_t kNormBlock = 1 << 16;
  std::vector<double> partial(static_cast<size_t>((n + kNormBlock - 1) / kNormBlock));
  parallel_blocks(n, kNormBlock, [&](int64_t block, int64_t b, int64_t e) {
    double sq = 0;
    for (int64_t j = b; j < e; ++j) sq += static_cast<double>(g[j]) * g[j];
    partial[static_cast<size_t>(block)] = sq;
  });
  double sq = 0;
  for (double p : partial) sq += p;
  return sq;
}

}  // namespace

double global_grad_norm(const std::vector<ParamState>& params, const std::vector<Tensor>& grads,
                        const mesh::ProcessMesh& mesh, comm::Communicator& world,
                        const std::vector<int>& disjoint_dims) {
  double total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    double replicas = 1;
    for (int m = 0; m < mesh.ndim(); ++m) {
      const bool disjoint = std::find(disjoint_dims.begin(), disjoint_dims.end(), m) != disjoint_dims.end();
      if (!disjoint && params[i].dist[m].is_replicate()) replicas *= static_cast<double>(mesh.dim_size(m));
    }
    total += sum_of_squares(grads[i].data<float>(), grads[i].numel()) / replicas;
  }
  world.all_reduce(&total, &total, 1, DType::F64, comm::Reduce::Sum);
  return std::sqrt(total);
}

double clip_grad_norm(std::vector<Tensor>& grads, double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return norm;
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  for (Tensor& g : grads) {
    float* p = g.data<float>();
    parallel_for(g.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) p[j] *= scale;
    });
  }
  return norm;
}

}  // namespace shardwise::train
