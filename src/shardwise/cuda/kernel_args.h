#pragma once
// The argument checks and pointer casts the CUDA kernels' wrappers share (kernels.cc,
// cross_entropy.cc): each names the kernel and the argument that is wrong.
#include <string>
#include <string_view>

#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda::detail {

inline void need(std::string_view kernel, std::string_view arg, const Tensor& t, DType dtype, Device device) {
  SW_CHECK(t.defined() && t.on_device() && t.device() == device && t.dtype() == dtype,
           "cuda {}: {} must be a {} tensor on {}, got {}", kernel, arg, dtype_name(dtype), device.to_string(),
           t.defined() ? t.to_string(0) : std::string("an undefined tensor"));
}
inline void need_shape(std::string_view kernel, std::string_view arg, const Tensor& t, const Shape& shape) {
  SW_CHECK(t.shape() == shape, "cuda {}: {} has shape {}, expected {}", kernel, arg, t.shape().to_string(),
           shape.to_string());
}
// need() and need_shape() at once, for an f32 argument.
inline void need_f32(std::string_view kernel, std::string_view arg, const Tensor& t, Device device, const Shape& shape) {
  need(kernel, arg, t, DType::F32, device);
  need_shape(kernel, arg, t, shape);
}
inline const float* f(const Tensor& t) { return static_cast<const float*>(t.device_ptr()); }
inline float* f(Tensor& t) { return static_cast<float*>(t.device_ptr()); }

struct Rows {
  int64_t rows, cols;
  Shape leading;
};
// x (an f32 device tensor of rank >= 1, the argument `name`) as rows over its last dim.
inline Rows rows_of(std::string_view kernel, const Tensor& x, std::string_view name = "x") {
  need(kernel, name, x, DType::F32, x.device());
  SW_CHECK(x.ndim() >= 1, "cuda {}: {} must have at least one dim", kernel, name);
  const Shape leading(x.shape().span().first(x.shape().size() - 1));
  return {leading.numel(), x.shape().back(), leading};
}
// A norm's backward: x as rows, scale [cols] and dout like x on x's device.
inline Rows norm_grad_rows(std::string_view kernel, const Tensor& x, const Tensor& scale, const Tensor& dout) {
  const Rows r = rows_of(kernel, x);
  need_f32(kernel, "scale", scale, x.device(), Shape{r.cols});
  need_f32(kernel, "dout", dout, x.device(), x.shape());
  return r;
}

}  // namespace shardwise::cuda::detail
