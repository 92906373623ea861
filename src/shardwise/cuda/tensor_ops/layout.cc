#include "shardwise/cuda/tensor_ops/layout.h"

#include <string>

#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/cuda/common/walk.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

using namespace detail;  // kernel_args.h, walk.h

namespace {

void need_device(std::string_view kernel, const Tensor& x) {
  SW_CHECK(x.defined() && x.on_device(), "cuda {}: x must be a tensor on a device, got {}", kernel,
           x.defined() ? x.to_string(0) : std::string("an undefined tensor"));
}

// dst (operand 1) at dst_offset, strides `dst_strides`, gets src (operand 0, contiguous, of `shape`).
void copy_into(const Tensor& src, Tensor& dst, const Shape& shape, const std::array<int64_t, kMaxDims>& src_strides,
               int64_t src_offset, const std::array<int64_t, kMaxDims>& dst_strides, int64_t dst_offset,
               Stream stream) {
  launch::Walk w = make_walk(shape, {src_strides, dst_strides});
  w.offset[0] = src_offset;
  w.offset[1] = dst_offset;
  check(launch::strided_copy(static_cast<int>(dtype_size(src.dtype())), src.device_ptr(), dst.device_ptr(), w,
                             stream.handle),
        "strided copy kernel");
}

int64_t offset_of(const Shape& s, std::span<const int64_t> starts) {
  const auto st = contiguous_strides(s);
  int64_t off = 0;
  for (size_t d = 0; d < starts.size(); ++d) off += starts[d] * st[d];
  return off;
}

void check_box(std::string_view kernel, const Shape& whole, std::span<const int64_t> starts,
               std::span<const int64_t> sizes) {
  SW_CHECK(static_cast<int>(starts.size()) == whole.ndim() && sizes.size() == starts.size(),
           "cuda {}: {} starts and {} sizes for a tensor of rank {}", kernel, starts.size(), sizes.size(), whole.ndim());
  for (int d = 0; d < whole.ndim(); ++d) {
    const auto du = static_cast<size_t>(d);
    SW_CHECK(starts[du] >= 0 && sizes[du] >= 0 && starts[du] + sizes[du] <= whole[d],
             "cuda {}: [{}, {}) of dim {} lies outside its extent {}", kernel, starts[du], starts[du] + sizes[du], d,
             whole[d]);
  }
}

Tensor reduce(std::string_view kernel, const Tensor& x, uint32_t mask, bool keepdim, bool mean, Stream stream) {
  const launch::Elem t = elem_of(kernel, "x", x);
  if (mask == 0) mask = (1u << x.ndim()) - 1;
  SW_CHECK(mask < (1u << x.ndim()), "cuda {}: axis mask {:#x} names a dim beyond rank {}", kernel, mask, x.ndim());
  const auto st = contiguous_strides(x.shape());
  Shape kept, reduced, out;
  std::array<int64_t, kMaxDims> kept_st{}, red_st{};
  for (int d = 0; d < x.ndim(); ++d) {
    const bool r = (mask >> d) & 1u;
    Shape& s = r ? reduced : kept;
    (r ? red_st : kept_st)[static_cast<size_t>(s.ndim())] = st[static_cast<size_t>(d)];
    s.push_back(x.shape()[d]);
    if (!r || keepdim) out.push_back(r ? 1 : x.shape()[d]);
  }
  Tensor result = empty_on(x.dtype(), out, x.device(), stream);
  const double divisor = mean ? static_cast<double>(reduced.numel()) : 1.0;
  check(launch::reduce_sum(t, x.device_ptr(), result.device_ptr(), make_walk(kept, {kept_st}),
                           make_walk(reduced, {red_st}), divisor, stream.handle),
        "reduce_sum kernel");
  return result;
}

}  // namespace

Tensor reduce_sum(const Tensor& x, uint32_t mask, bool keepdim, Stream stream) {
  return reduce("reduce_sum", x, mask, keepdim, false, stream);
}

Tensor reduce_mean(const Tensor& x, uint32_t mask, bool keepdim, Stream stream) {
  return reduce("reduce_mean", x, mask, keepdim, true, stream);
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape, Stream stream) {
  if (grad.shape() == shape) return grad;
  SW_CHECK(broadcasts_to(shape, grad.shape()), "cuda sum_to_shape: {} does not broadcast to {}", shape.to_string(),
           grad.shape().to_string());
  const int lead = grad.ndim() - shape.ndim();
  uint32_t mask = 0;
  for (int d = 0; d < grad.ndim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1)) mask |= 1u << d;
  }
  if (mask == 0) return grad.reshaped(shape);
  return reduce("sum_to_shape", grad, mask, false, false, stream).reshaped(shape);
}

Tensor transpose(const Tensor& x, std::span<const int> perm, Stream stream) {
  need_device("transpose", x);
  SW_CHECK(static_cast<int>(perm.size()) == x.ndim(), "cuda transpose: perm has {} entries for rank {}", perm.size(),
           x.ndim());
  const auto st = contiguous_strides(x.shape());
  std::array<int64_t, kMaxDims> src{};
  Shape out;
  uint32_t seen = 0;
  for (size_t j = 0; j < perm.size(); ++j) {
    SW_CHECK(perm[j] >= 0 && perm[j] < x.ndim() && !((seen >> perm[j]) & 1u),
             "cuda transpose: perm is not a permutation of the {} dims (entry {} is {})", x.ndim(), j, perm[j]);
    seen |= 1u << perm[j];
    out.push_back(x.shape()[perm[j]]);
    src[j] = st[static_cast<size_t>(perm[j])];
  }
  Tensor y = empty_on(x.dtype(), out, x.device(), stream);
  copy_into(x, y, out, src, 0, contiguous_strides(out), 0, stream);
  return y;
}

Tensor slice(const Tensor& x, std::span<const int64_t> starts, std::span<const int64_t> sizes, Stream stream) {
  need_device("slice", x);
  check_box("slice", x.shape(), starts, sizes);
  const Shape out{sizes};
  Tensor y = empty_on(x.dtype(), out, x.device(), stream);
  copy_into(x, y, out, contiguous_strides(x.shape()), offset_of(x.shape(), starts), contiguous_strides(out), 0, stream);
  return y;
}

Tensor slice_backward(const Tensor& dout, const Shape& x_shape, std::span<const int64_t> starts, Stream stream) {
  need_device("slice_backward", dout);
  check_box("slice_backward", x_shape, starts, dout.shape().span());
  Tensor dx = zeros_on(dout.dtype(), x_shape, dout.device(), stream);
  copy_into(dout, dx, dout.shape(), contiguous_strides(dout.shape()), 0, contiguous_strides(x_shape),
            offset_of(x_shape, starts), stream);
  return dx;
}

Tensor concat(std::span<const Tensor> xs, int axis, Stream stream) {
  SW_CHECK(!xs.empty(), "cuda concat: no inputs");
  need_device("concat", xs[0]);
  const Tensor& first = xs[0];
  SW_CHECK(axis >= 0 && axis < first.ndim(), "cuda concat: axis {} is outside rank {}", axis, first.ndim());
  Shape out = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    Shape expect = first.shape();
    expect[axis] = xs[i].shape()[axis];
    need("concat", "input " + std::to_string(i), xs[i], first.dtype(), first.device());
    need_shape("concat", "input " + std::to_string(i), xs[i], expect);
    total += xs[i].shape()[axis];
  }
  out[axis] = total;
  Tensor y = empty_on(first.dtype(), out, first.device(), stream);
  const auto dst = contiguous_strides(out);
  int64_t at = 0;
  for (const Tensor& x : xs) {
    copy_into(x, y, x.shape(), contiguous_strides(x.shape()), 0, dst, at * dst[static_cast<size_t>(axis)], stream);
    at += x.shape()[axis];
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, int axis, std::span<const int64_t> sizes, Stream stream) {
  need_device("split", x);
  SW_CHECK(axis >= 0 && axis < x.ndim(), "cuda split: axis {} is outside rank {}", axis, x.ndim());
  std::vector<int64_t> starts(static_cast<size_t>(x.ndim()), 0);
  std::vector<int64_t> extent(x.shape().span().begin(), x.shape().span().end());
  std::vector<Tensor> out;
  for (int64_t size : sizes) {
    extent[static_cast<size_t>(axis)] = size;
    out.push_back(slice(x, starts, extent, stream));
    starts[static_cast<size_t>(axis)] += size;
  }
  SW_CHECK(starts[static_cast<size_t>(axis)] == x.shape()[axis], "cuda split: the sizes add up to {}, not extent {}",
           starts[static_cast<size_t>(axis)], x.shape()[axis]);
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape, Stream stream) {
  need_device("expand", x);
  SW_CHECK(broadcasts_to(x.shape(), shape), "cuda expand: {} does not broadcast to {}", x.shape().to_string(),
           shape.to_string());
  Tensor y = empty_on(x.dtype(), shape, x.device(), stream);
  copy_into(x, y, shape, broadcast_strides(x.shape(), shape), 0, contiguous_strides(shape), 0, stream);
  return y;
}

Tensor copy(const Tensor& x, Stream stream) {
  need_device("copy", x);
  Tensor y = empty_on(x.dtype(), x.shape(), x.device(), stream);
  const auto st = contiguous_strides(x.shape());
  copy_into(x, y, x.shape(), st, 0, st, 0, stream);
  return y;
}

}  // namespace shardwise::cuda
