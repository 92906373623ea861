#include "shardwise/cuda/tensor_ops/elementwise.h"

#include <bit>
#include <cstring>

#include "shardwise/core/half.h"
#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda/common/walk.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h, walk.h

namespace {

// x and y of one floating dtype on one device, and the walk of their broadcast with `out` (operand 2).
launch::Elem pair_elem(std::string_view kernel, const Tensor& x, const Tensor& y) {
  const launch::Elem t = elem_of(kernel, "x", x);
  need(kernel, "y", y, x.dtype(), x.device());
  return t;
}

launch::Walk broadcast_walk(const Shape& out, const Shape& xs, const Shape& ys) {
  return make_walk(out, {broadcast_strides(xs, out), broadcast_strides(ys, out), contiguous_strides(out)});
}

}  // namespace

Tensor binary(Binary op, const Tensor& x, const Tensor& y, Stream stream) {
  const launch::Elem t = pair_elem("binary", x, y);
  const Shape shape = broadcast_shapes(x.shape(), y.shape());
  Tensor out = empty_on(x.dtype(), shape, x.device(), stream);
  check(launch::binary_forward(op, t, x.device_ptr(), y.device_ptr(), out.device_ptr(),
                               broadcast_walk(shape, x.shape(), y.shape()), stream.handle),
        "binary kernel");
  return out;
}

BinaryGrads binary_backward(Binary op, const Tensor& x, const Tensor& y, const Tensor& dout, Stream stream) {
  const launch::Elem t = pair_elem("binary_backward", x, y);
  const Shape shape = broadcast_shapes(x.shape(), y.shape());
  need("binary_backward", "dout", dout, x.dtype(), x.device());
  need_shape("binary_backward", "dout", dout, shape);
  Tensor gx = empty_on(x.dtype(), shape, x.device(), stream), gy = empty_on(x.dtype(), shape, x.device(), stream);
  check(launch::binary_backward(op, t, x.device_ptr(), y.device_ptr(), dout.device_ptr(), gx.device_ptr(),
                                gy.device_ptr(), broadcast_walk(shape, x.shape(), y.shape()), stream.handle),
        "binary_backward kernel");
  return {sum_to_shape(gx, x.shape(), stream), sum_to_shape(gy, y.shape(), stream)};
}

Tensor unary(Unary op, const Tensor& x, Stream stream) {
  const launch::Elem t = elem_of("unary", "x", x);
  Tensor out = empty_on(x.dtype(), x.shape(), x.device(), stream);
  check(launch::unary_forward(op, t, x.device_ptr(), out.device_ptr(), x.numel(), stream.handle), "unary kernel");
  return out;
}

Tensor unary_backward(Unary op, const Tensor& x, const Tensor& out, const Tensor& dy, Stream stream) {
  const launch::Elem t = elem_of("unary_backward", "dy", dy);
  for (const auto& [arg, tensor] : {std::pair{"x", &x}, std::pair{"out", &out}}) {
    need("unary_backward", arg, *tensor, dy.dtype(), dy.device());
    need_shape("unary_backward", arg, *tensor, dy.shape());
  }
  Tensor dx = empty_on(dy.dtype(), dy.shape(), dy.device(), stream);
  check(launch::unary_backward(op, t, x.device_ptr(), out.device_ptr(), dy.device_ptr(), dx.device_ptr(), dy.numel(),
                               stream.handle),
        "unary_backward kernel");
  return dx;
}

Tensor swiglu(const Tensor& gate, const Tensor& up, Stream stream) {
  const launch::Elem t = elem_of("swiglu", "gate", gate);
  need_like("swiglu", "up", up, gate, gate.shape());
  Tensor out = empty_on(gate.dtype(), gate.shape(), gate.device(), stream);
  check(launch::swiglu_forward(t, gate.device_ptr(), up.device_ptr(), out.device_ptr(), gate.numel(), stream.handle),
        "swiglu kernel");
  return out;
}

SwigluGrads swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Stream stream) {
  const launch::Elem t = elem_of("swiglu_backward", "gate", gate);
  need_like("swiglu_backward", "up", up, gate, gate.shape());
  need_like("swiglu_backward", "dout", dout, gate, gate.shape());
  SwigluGrads g{empty_on(gate.dtype(), gate.shape(), gate.device(), stream),
                empty_on(gate.dtype(), gate.shape(), gate.device(), stream)};
  check(launch::swiglu_backward(t, gate.device_ptr(), up.device_ptr(), dout.device_ptr(), g.dgate.device_ptr(),
                                g.dup.device_ptr(), gate.numel(), stream.handle),
        "swiglu_backward kernel");
  return g;
}

Tensor scale(const Tensor& x, double scale, double bias, bool bias_after_scale, Stream stream) {
  const launch::Elem t = elem_of("scale", "x", x);
  Tensor out = empty_on(x.dtype(), x.shape(), x.device(), stream);
  check(launch::scale(t, x.device_ptr(), out.device_ptr(), x.numel(), static_cast<float>(scale),
                      static_cast<float>(bias), bias_after_scale, stream.handle),
        "scale kernel");
  return out;
}

Tensor cast(const Tensor& x, DType dtype, Stream stream) {
  const launch::Elem from = elem_of("cast", "x", x);
  Tensor out = empty_on(dtype, x.shape(), x.device(), stream);
  const launch::Elem to = elem_of("cast", "the target dtype", out);
  check(launch::cast(from, to, x.device_ptr(), out.device_ptr(), x.numel(), stream.handle), "cast kernel");
  return out;
}

Tensor full(DType dtype, const Shape& shape, double value, Device device, Stream stream) {
  uint64_t bits = 0;
  switch (dtype) {
    case DType::F32: bits = std::bit_cast<uint32_t>(static_cast<float>(value)); break;
    case DType::BF16: bits = bf16(static_cast<float>(value)).bits; break;
    case DType::F16: bits = f16(static_cast<float>(value)).bits; break;
    case DType::I64: bits = static_cast<uint64_t>(static_cast<int64_t>(value)); break;
    case DType::I32: bits = static_cast<uint32_t>(static_cast<int32_t>(value)); break;
    default: fail("cuda full: {} is not supported (allowed: f32, bf16, f16, i64, i32)", dtype_name(dtype));
  }
  Tensor out = empty_on(dtype, shape, device, stream);
  check(launch::fill(static_cast<int>(dtype_size(dtype)), bits, out.device_ptr(), out.numel(), stream.handle),
        "fill kernel");
  return out;
}

}  // namespace shardwise::cuda
