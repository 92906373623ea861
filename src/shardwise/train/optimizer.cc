#include "shardwise/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/train_kernels.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::train {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return floor;
  double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  double progress = static_cast<double>(step - warmup) / span;
  return floor + 0.5 * (peak - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

bool has_own_master(const ParamState& p) {
  if (!p.master.defined()) return false;
  if (p.master.on_device() != p.param.on_device()) return true;
  return p.master.on_device() ? p.master.device_ptr() != p.param.device_ptr() : p.master.raw() != p.param.raw();
}

ops::AdamWHyper AdamW::hyper(bool decay, double lr, int64_t step) const {
  return ops::AdamWHyper{c_.beta1, c_.beta2, c_.epsilon, c_.weight_decay, lr, step, decay};
}

void AdamW::step(std::vector<ParamState>& params, const std::vector<Tensor>& grads, double lr, int64_t step) const {
  SW_CHECK(params.size() == grads.size(), "AdamW: {} parameters but {} gradients", params.size(), grads.size());
  SW_CHECK(step >= 1, "AdamW: steps count from 1, got {}", step);
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState& p = params[i];
    const Tensor& g = grads[i];
    SW_CHECK(g.dtype() == DType::F32 && g.shape() == p.master.shape(), "AdamW: the gradient of '{}' is {} {}, expected f32 {}",
             p.name, dtype_name(g.dtype()), g.shape().to_string(), p.master.shape().to_string());
    if (p.master.on_device()) {  // the device's kernel, the bf16 copy in the same launch
      const bool copy = p.param.dtype() != DType::F32;
      ops::adamw_on_device(p.master, p.exp_avg, p.exp_avg_sq, g, hyper(p.decay, lr, step), copy ? &p.param : nullptr);
      continue;
    }
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
  ops::adamw_update(w, m, v, gr, n, hyper(decay_on, lr, step));
}

double global_grad_norm(const std::vector<ParamState>& params, const std::vector<Tensor>& grads,
                        const mesh::ProcessMesh& mesh, comm::Communicator& world,
                        const std::vector<int>& disjoint_dims) {
  // On a device: each gradient's sum of squares there, read by the host in one copy.
  const bool device = !grads.empty() && grads[0].on_device();
  Tensor squares;
  if (device) squares = to_host(ops::squares_on_device(grads), current_stream()).to(DType::F64);
  double total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    double replicas = 1;
    for (int m = 0; m < mesh.ndim(); ++m) {
      const bool disjoint = std::find(disjoint_dims.begin(), disjoint_dims.end(), m) != disjoint_dims.end();
      if (!disjoint && params[i].dist[m].is_replicate()) replicas *= static_cast<double>(mesh.dim_size(m));
    }
    const double sq = device ? squares.data<double>()[i] : ops::sum_of_squares(grads[i].data<float>(), grads[i].numel());
    total += sq / replicas;
  }
  world.all_reduce(&total, &total, 1, DType::F64, comm::Reduce::Sum);
  return std::sqrt(total);
}

void scale_grads(std::vector<Tensor>& grads, float scale) {
  for (Tensor& g : grads) {
    if (g.on_device()) ops::scale_on_device(g, scale);
    else ops::scale_in_place(g.data<float>(), g.numel(), scale);
  }
}

double clip_grad_norm(std::vector<Tensor>& grads, double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return norm;
  scale_grads(grads, static_cast<float>(max_norm / (norm + 1e-6)));
  return norm;
}

}  // namespace shardwise::train
