#include "shardwise/cuda/layers/kernels.h"

#include <cmath>
#include <initializer_list>
#include <string_view>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h


Tensor activation(Activation op, const Tensor& x, Stream stream) {
  need("activation", "x", x, DType::F32, x.device());
  Tensor y = empty_on(DType::F32, x.shape(), x.device(), stream);
  check(launch::activation_forward(op, f(x), f(y), x.numel(), stream.handle), "activation kernel");
  return y;
}

Tensor activation_backward(Activation op, const Tensor& x, const Tensor& dy, Stream stream) {
  need("activation_backward", "x", x, DType::F32, x.device());
  need_f32("activation_backward", "dy", dy, x.device(), x.shape());
  Tensor dx = empty_on(DType::F32, x.shape(), x.device(), stream);
  check(launch::activation_backward(op, f(x), f(dy), f(dx), x.numel(), stream.handle), "activation_backward kernel");
  return dx;
}

void adamw_update(Tensor& w, Tensor& m, Tensor& v, const Tensor& g, const AdamWArgs& a, Stream stream,
                  Tensor* bf16_param) {
  SW_CHECK(a.step >= 1, "cuda adamw: steps count from 1, got {}", a.step);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&w, &m, &v, &g}) {
    need_f32("adamw", "every argument", *t, w.device(), w.shape());
  }
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const launch::AdamWScalars c{static_cast<float>(a.beta1), static_cast<float>(a.beta2),
                               static_cast<float>(a.lr / bc1), static_cast<float>(1.0 / std::sqrt(bc2)),
                               static_cast<float>(a.epsilon),
                               a.decay ? static_cast<float>(1.0 - a.lr * a.weight_decay) : 1.0f};
  void* param = nullptr;
  if (bf16_param != nullptr) {
    need("adamw", "the bf16 parameter", *bf16_param, DType::BF16, w.device());
    need_shape("adamw", "the bf16 parameter", *bf16_param, w.shape());
    param = bf16_param->device_ptr();
  }
  check(launch::adamw(f(w), f(m), f(v), f(g), param, w.numel(), c, stream.handle), "adamw kernel");
}

LayerNormResult layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, double epsilon, Stream stream) {
  const Device d = x.device();
  launch::Elem t{};
  const Rows r = norm_rows("layer_norm", x, t);
  need_like("layer_norm", "scale", scale, x, Shape{r.cols});
  need_like("layer_norm", "bias", bias, x, Shape{r.cols});
  LayerNormResult out{empty_on(x.dtype(), x.shape(), d, stream), empty_on(DType::F32, r.leading, d, stream),
                      empty_on(DType::F32, r.leading, d, stream)};
  check(launch::layer_norm_forward(t, x.device_ptr(), scale.device_ptr(), bias.device_ptr(), out.out.device_ptr(),
                                   f(out.mean), f(out.rstd), r.rows, r.cols, epsilon, stream.handle),
        "layer_norm kernel");
  return out;
}

LayerNormGradResult layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dout, Stream stream) {
  const Device d = x.device();
  launch::Elem t{};
  const Rows r = norm_grad_rows("layer_norm_backward", x, scale, dout, t);
  need_f32("layer_norm_backward", "mean", mean, d, r.leading);
  need_f32("layer_norm_backward", "rstd", rstd, d, r.leading);
  LayerNormGradResult g{empty_on(x.dtype(), x.shape(), d, stream), empty_on(x.dtype(), Shape{r.cols}, d, stream),
                        empty_on(x.dtype(), Shape{r.cols}, d, stream)};
  check(launch::layer_norm_backward(t, x.device_ptr(), scale.device_ptr(), f(mean), f(rstd), dout.device_ptr(),
                                    g.dx.device_ptr(), g.dscale.device_ptr(), g.dbias.device_ptr(), r.rows, r.cols,
                                    stream.handle),
        "layer_norm_backward kernel");
  return g;
}

RmsNormResult rms_norm(const Tensor& x, const Tensor& scale, double epsilon, Stream stream) {
  const Device d = x.device();
  launch::Elem t{};
  const Rows r = norm_rows("rms_norm", x, t);
  need_like("rms_norm", "scale", scale, x, Shape{r.cols});
  RmsNormResult out{empty_on(x.dtype(), x.shape(), d, stream), empty_on(DType::F32, r.leading, d, stream)};
  check(launch::rms_norm_forward(t, x.device_ptr(), scale.device_ptr(), out.out.device_ptr(), f(out.inv_rms), r.rows,
                                 r.cols, epsilon, stream.handle),
        "rms_norm kernel");
  return out;
}

RmsNormGradResult rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dout,
                                    Stream stream) {
  const Device d = x.device();
  launch::Elem t{};
  const Rows r = norm_grad_rows("rms_norm_backward", x, scale, dout, t);
  need_f32("rms_norm_backward", "inv_rms", inv_rms, d, r.leading);
  RmsNormGradResult g{empty_on(x.dtype(), x.shape(), d, stream), empty_on(x.dtype(), Shape{r.cols}, d, stream)};
  check(launch::rms_norm_backward(t, x.device_ptr(), scale.device_ptr(), f(inv_rms), dout.device_ptr(),
                                  g.dx.device_ptr(), g.dscale.device_ptr(), r.rows, r.cols, stream.handle),
        "rms_norm_backward kernel");
  return g;
}

Tensor softmax(const Tensor& x, Stream stream) {
  launch::Elem t{};
  const Rows r = norm_rows("softmax", x, t);
  Tensor y = empty_on(x.dtype(), x.shape(), x.device(), stream);
  check(launch::softmax_forward(t, x.device_ptr(), y.device_ptr(), r.rows, r.cols, stream.handle), "softmax kernel");
  return y;
}

Tensor softmax_backward(const Tensor& out, const Tensor& dout, Stream stream) {
  launch::Elem t{};
  const Rows r = norm_rows("softmax_backward", out, t, "out");
  need_like("softmax_backward", "dout", dout, out, out.shape());
  Tensor dx = empty_on(out.dtype(), out.shape(), out.device(), stream);
  check(launch::softmax_backward(t, out.device_ptr(), dout.device_ptr(), dx.device_ptr(), r.rows, r.cols, stream.handle),
        "softmax_backward kernel");
  return dx;
}

}  // namespace shardwise::cuda
