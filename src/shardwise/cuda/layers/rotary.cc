#include <cmath>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h

namespace {

// x (f32 or bf16, [..., S, D] with D even) and positions ([S], or [x's dim 0, S]; i64 or i32) on
// one device, as the launcher's shape; Error naming the kernel and the argument otherwise.
launch::RotaryShape rotary_shape(std::string_view kernel, const Tensor& x, const Tensor& positions, double theta) {
  SW_CHECK(x.defined() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16), "cuda {}: x must be f32 or bf16, got {}",
           kernel, x.defined() ? dtype_name(x.dtype()) : "undefined");
  need(kernel, "x", x, x.dtype(), x.device());
  SW_CHECK(x.ndim() >= 2 && x.shape().back() % 2 == 0,
           "cuda {}: x must be [..., S, D] with D (the head dim) even, got {}", kernel, x.shape().to_string());
  SW_CHECK(positions.defined() && (positions.dtype() == DType::I64 || positions.dtype() == DType::I32),
           "cuda {}: positions must be i64 or i32", kernel);
  need(kernel, "positions", positions, positions.dtype(), x.device());
  const int64_t D = x.shape().back(), S = x.shape()[x.ndim() - 2], rows = x.numel() / std::max<int64_t>(D, 1);
  const bool per_batch = positions.ndim() == 2 && x.ndim() >= 3;
  need_shape(kernel, "positions", positions, per_batch ? Shape{x.shape()[0], S} : Shape{S});
  SW_CHECK(theta > 0 && std::isfinite(theta), "cuda {}: theta must be a positive number, got {}", kernel, theta);
  const int64_t B = per_batch ? x.shape()[0] : 0;
  return {rows, S, D, B > 0 ? rows / B : 0, static_cast<float>(theta)};
}

Tensor rotate(std::string_view kernel, const Tensor& x, const Tensor& positions, double theta, int sign, Stream stream) {
  const launch::RotaryShape r = rotary_shape(kernel, x, positions, theta);
  Tensor out = empty_on(x.dtype(), x.shape(), x.device(), stream);
  const launch::Elem e = x.dtype() == DType::F32 ? launch::Elem::F32 : launch::Elem::BF16;
  check(launch::rotary(e, x.device_ptr(), out.device_ptr(), positions.device_ptr(), positions.dtype() == DType::I32, r,
                       sign, stream.handle),
        "rotary kernel");
  return out;
}

}  // namespace

Tensor rotary_embedding(const Tensor& x, const Tensor& positions, double theta, Stream stream) {
  return rotate("rotary_embedding", x, positions, theta, 1, stream);
}

Tensor rotary_embedding_backward(const Tensor& dout, const Tensor& positions, double theta, Stream stream) {
  return rotate("rotary_embedding_backward", dout, positions, theta, -1, stream);
}

}  // namespace shardwise::cuda
