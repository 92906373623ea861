#include "shardwise/ops/train_kernels.h"

#include <cmath>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/device_kernels.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

void adamw_update(float* w, float* m, float* v, const float* gr, int64_t n, const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float step_size = static_cast<float>(h.lr / bc1), inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(h.epsilon);
  const float decay = h.decay ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  parallel_for(n, kParallelGrain / 4, [&](int64_t b, int64_t e) {  // elementwise: any split gives the same bits
    for (int64_t j = b; j < e; ++j) {
      m[j] = b1 * m[j] + (1.0f - b1) * gr[j];
      v[j] = b2 * v[j] + (1.0f - b2) * gr[j] * gr[j];
      w[j] = w[j] * decay - step_size * m[j] / (std::sqrt(v[j]) * inv_bc2_sqrt + eps);
    }
  });
}

// A gradient of at most one block is summed in one loop; a larger one's sum differs from that
// loop's by double rounding.
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

void scale_in_place(float* p, int64_t n, float s) {
  parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) p[j] *= s;
  });
}

namespace {

// The kind's optimizer kernels, `pick` one of them: an Error naming `what` and the device when none.
template <class Fn>
Fn train_kernel(Device device, Fn DeviceTrainKernels::*pick, const char* what) {
  SW_CHECK(!device.is_host(), "{}: the tensors are on the host (the CPU kernel runs there)", what);
  const auto table = device_kernels(device.kind);
  SW_CHECK(table != nullptr && table->train_kernels().*pick,
           "{} on {}: no such optimizer kernel is installed for this device kind", what, device.to_string());
  return table->train_kernels().*pick;  // a copy: the table may be replaced while it runs
}

void check_device(const Tensor& t, Device device, const char* what, const char* name) {
  SW_CHECK(t.defined() && t.device() == device, "{}: {} is {} but the others are on {}", what, name,
           t.defined() ? t.device().to_string() : std::string("undefined"), device.to_string());
}

}  // namespace

void adamw_on_device(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, const AdamWHyper& h,
                     Tensor* bf16_param) {
  const Device d = master.device();
  check_device(exp_avg, d, "adamw", "exp_avg");
  check_device(exp_avg_sq, d, "adamw", "exp_avg_sq");
  check_device(grad, d, "adamw", "the gradient");
  SW_CHECK(master.dtype() == DType::F32 && grad.dtype() == DType::F32 && grad.numel() == master.numel(),
           "adamw: the master is {} {} and the gradient {} {}; both f32 of one size", dtype_name(master.dtype()),
           master.shape().to_string(), dtype_name(grad.dtype()), grad.shape().to_string());
  if (bf16_param) check_device(*bf16_param, d, "adamw", "the bf16 parameter");
  train_kernel(d, &DeviceTrainKernels::adamw, "adamw")(master, exp_avg, exp_avg_sq, grad, h, bf16_param);
}

Tensor squares_on_device(std::span<const Tensor> grads) {
  SW_CHECK(!grads.empty(), "sums of squares: no gradients");
  const Device d = grads[0].device();
  for (const Tensor& g : grads) check_device(g, d, "sums of squares", "a gradient");
  return train_kernel(d, &DeviceTrainKernels::squares, "sums of squares")(grads);
}

void scale_on_device(Tensor& t, float s) {
  SW_CHECK(t.dtype() == DType::F32, "scale: {} is {}, expected f32", t.shape().to_string(), dtype_name(t.dtype()));
  train_kernel(t.device(), &DeviceTrainKernels::scale, "scale")(t, s);
}

void accumulate_on_device(Tensor& sum, const Tensor& g) {
  if (sum.defined()) check_device(sum, g.device(), "gradient sum", "the sum");
  train_kernel(g.device(), &DeviceTrainKernels::accumulate, "gradient sum")(sum, g);
}

}  // namespace shardwise::ops
