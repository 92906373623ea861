#include "shardwise/reshard/device_blocks.h"

#include "shardwise/core/error.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/device_memory.h"

namespace shardwise::reshard::device_blocks {
namespace {

// Copies the box of shape `box` at `src_at` of a contiguous `src_shape` array to `dst_at` of a
// contiguous `dst_shape` array (element offsets per dim), `elem` bytes an element.
struct BoxCopy {
  const std::byte* src;
  Shape src_shape;
  std::array<int64_t, kMaxDims> src_at{};
  std::byte* dst;
  Shape dst_shape;
  std::array<int64_t, kMaxDims> dst_at{};
  Shape box;
  size_t elem;
};

void copy_box(const BoxCopy& c, Device device) {
  if (c.box.numel() == 0) return;
  DeviceMemory& memory = device_memory(device);
  const Stream stream = current_stream();
  const int nd = c.box.ndim();
  const auto ss = contiguous_strides(c.src_shape), ds = contiguous_strides(c.dst_shape);
  if (nd == 0) return memory.copy_on_device(c.dst, c.src, c.elem, stream);
  // Trailing dims that are whole in both arrays fold into the row.
  int k = nd - 1;
  int64_t row = c.box[k];
  while (k > 0 && c.box[k] == c.src_shape[k] && c.box[k] == c.dst_shape[k]) row *= c.box[--k];
  const int rows_dim = k - 1;  // -1: one row
  const int64_t rows = rows_dim >= 0 ? c.box[rows_dim] : 1;
  const size_t src_pitch = rows_dim >= 0 ? static_cast<size_t>(ss[static_cast<size_t>(rows_dim)]) * c.elem : 0;
  const size_t dst_pitch = rows_dim >= 0 ? static_cast<size_t>(ds[static_cast<size_t>(rows_dim)]) * c.elem : 0;
  // The outer dims [0, rows_dim) loop, in row-major order.
  std::array<int64_t, kMaxDims> idx{};
  const int outer = std::max(rows_dim, 0);
  while (true) {
    int64_t s = 0, d = 0;
    for (int i = 0; i < nd; ++i) {
      const auto u = static_cast<size_t>(i);
      const int64_t at = i < outer ? idx[u] : 0;
      s += (c.src_at[u] + at) * ss[u];
      d += (c.dst_at[u] + at) * ds[u];
    }
    memory.copy_2d(c.dst + static_cast<size_t>(d) * c.elem, dst_pitch, c.src + static_cast<size_t>(s) * c.elem, src_pitch,
                   static_cast<size_t>(row) * c.elem, static_cast<size_t>(rows), stream);
    int i = outer - 1;
    while (i >= 0 && ++idx[static_cast<size_t>(i)] == c.box[i]) idx[static_cast<size_t>(i--)] = 0;
    if (i < 0) break;
  }
}

std::array<int64_t, kMaxDims> relative(const Box& inner, const Box& outer) {
  std::array<int64_t, kMaxDims> off{};
  for (int d = 0; d < inner.shape.ndim(); ++d) off[static_cast<size_t>(d)] = inner.offset[static_cast<size_t>(d)] - outer.offset[static_cast<size_t>(d)];
  return off;
}

}  // namespace

Tensor empty(DType dtype, const Shape& shape, Device device) { return empty_on(dtype, shape, device, current_stream()); }

Tensor zeros(DType dtype, const Shape& shape, Device device) { return zeros_on(dtype, shape, device, current_stream()); }

Tensor cut(const Tensor& t, const Box& outer, const Box& inner) {
  if (inner.shape == outer.shape && inner.offset == outer.offset) return t;
  Tensor out = empty(t.dtype(), inner.shape, t.device());
  copy_box({static_cast<const std::byte*>(t.device_ptr()), outer.shape, relative(inner, outer),
            static_cast<std::byte*>(out.device_ptr()), inner.shape, {}, inner.shape, dtype_size(t.dtype())},
           t.device());
  return out;
}

void put(Tensor& t, const Box& outer, const Tensor& piece, const Box& inner, int64_t first) {
  if (inner.numel() == 0) return;
  const size_t elem = dtype_size(t.dtype());
  copy_box({static_cast<const std::byte*>(piece.device_ptr()) + static_cast<size_t>(first) * elem, inner.shape, {},
            static_cast<std::byte*>(t.device_ptr()), outer.shape, relative(inner, outer), inner.shape, elem},
           t.device());
}

Tensor pack(const Tensor& t, const Box& outer, std::span<const Box> inner) {
  int64_t n = 0;
  for (const Box& b : inner) n += b.numel();
  Tensor out = empty(t.dtype(), Shape{n}, t.device());
  const size_t elem = dtype_size(t.dtype());
  int64_t at = 0;
  for (const Box& b : inner) {
    if (b.numel() == 0) continue;
    copy_box({static_cast<const std::byte*>(t.device_ptr()), outer.shape, relative(b, outer),
              static_cast<std::byte*>(out.device_ptr()) + static_cast<size_t>(at) * elem, b.shape, {}, b.shape, elem},
             t.device());
    at += b.numel();
  }
  return out;
}

}  // namespace shardwise::reshard::device_blocks
