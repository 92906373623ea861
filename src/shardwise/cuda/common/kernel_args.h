#pragma once
// The argument checks and pointer casts the CUDA kernels' wrappers share (kernels.cc,
// cross_entropy.cc): each names the kernel and the argument that is wrong.
#include <string>
#include <string_view>

#include "shardwise/cuda/common/tensor_launchers.h"
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
// x (a device tensor of `dtype` and rank >= 1, the argument `name`) as rows over its last dim.
inline Rows rows_of(std::string_view kernel, const Tensor& x, std::string_view name = "x", DType dtype = DType::F32) {
  need(kernel, name, x, dtype, x.device());
  SW_CHECK(x.ndim() >= 1, "cuda {}: {} must have at least one dim", kernel, name);
  const Shape leading(x.shape().span().first(x.shape().size() - 1));
  return {leading.numel(), x.shape().back(), leading};
}
// A norm's (or softmax's) x (f32 or bf16; the argument `name`) as rows, and its element type.
inline Rows norm_rows(std::string_view kernel, const Tensor& x, launch::Elem& elem, std::string_view name = "x") {
  SW_CHECK(x.defined() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16), "cuda {}: {} must be f32 or bf16, got {}",
           kernel, name, x.defined() ? x.to_string(0) : std::string("an undefined tensor"));
  elem = x.dtype() == DType::F32 ? launch::Elem::F32 : launch::Elem::BF16;
  return rows_of(kernel, x, name, x.dtype());
}
// A parameter or gradient of a norm: x's dtype and device, `shape`.
inline void need_like(std::string_view kernel, std::string_view arg, const Tensor& t, const Tensor& x,
                      const Shape& shape) {
  need(kernel, arg, t, x.dtype(), x.device());
  need_shape(kernel, arg, t, shape);
}
// A norm's backward: x as rows, scale [cols] and dout like x on x's device.
inline Rows norm_grad_rows(std::string_view kernel, const Tensor& x, const Tensor& scale, const Tensor& dout,
                           launch::Elem& elem) {
  const Rows r = norm_rows(kernel, x, elem);
  need_like(kernel, "scale", scale, x, Shape{r.cols});
  need_like(kernel, "dout", dout, x, x.shape());
  return r;
}

}  // namespace shardwise::cuda::detail
