#include "shardwise/cuda/tensor_ops/dropout.h"

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/cuda/common/walk.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h, walk.h

namespace {

float keep_scale(const DropoutOptions& o) { return o.training ? static_cast<float>(1.0 / (1.0 - o.p)) : 1.0f; }

}  // namespace

DropoutResult dropout(const Tensor& x, const Shape& global_shape, std::span<const int64_t> offset,
                      const DropoutOptions& o, Stream stream) {
  const launch::Elem t = elem_of("dropout", "x", x);
  SW_CHECK(o.p >= 0.0 && o.p < 1.0, "cuda dropout: p must be in [0, 1), got {}", o.p);
  SW_CHECK(global_shape.ndim() == x.ndim() && offset.size() == static_cast<size_t>(x.ndim()),
           "cuda dropout: a block of rank {} needs a global shape and an offset of that rank, got {} and {} offsets",
           x.ndim(), global_shape.to_string(), offset.size());
  int64_t base = 0;
  const auto gstride = contiguous_strides(global_shape);
  for (int d = 0; d < x.ndim(); ++d) {
    const auto du = static_cast<size_t>(d);
    SW_CHECK(offset[du] >= 0 && offset[du] + x.shape()[d] <= global_shape[d],
             "cuda dropout: the block {} at offset {} of dim {} does not fit in the global shape {}",
             x.shape().to_string(), offset[du], d, global_shape.to_string());
    base += offset[du] * gstride[du];
  }
  DropoutResult r{empty_on(x.dtype(), x.shape(), x.device(), stream),
                  empty_on(DType::U8, x.shape(), x.device(), stream)};
  if (!o.training) {
    check(launch::fill(1, 1, r.mask.device_ptr(), r.mask.numel(), stream.handle), "dropout mask fill kernel");
    r.out = copy(x, stream);
    return r;
  }
  launch::Walk global = make_walk(x.shape(), {gstride});
  global.offset[0] = base;
  check(launch::dropout_forward(t, x.device_ptr(), r.out.device_ptr(), static_cast<uint8_t*>(r.mask.device_ptr()),
                                global, o.seed, o.stream, o.p, keep_scale(o), stream.handle),
        "dropout kernel");
  return r;
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, const DropoutOptions& o, Stream stream) {
  const launch::Elem t = elem_of("dropout_backward", "dy", dy);
  need("dropout_backward", "mask", mask, DType::U8, dy.device());
  need_shape("dropout_backward", "mask", mask, dy.shape());
  Tensor dx = empty_on(dy.dtype(), dy.shape(), dy.device(), stream);
  check(launch::dropout_apply(t, dy.device_ptr(), static_cast<const uint8_t*>(mask.device_ptr()), dx.device_ptr(),
                              dy.numel(), keep_scale(o), stream.handle),
        "dropout_backward kernel");
  return dx;
}

}  // namespace shardwise::cuda
