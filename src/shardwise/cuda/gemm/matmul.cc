#include "shardwise/cuda/gemm/matmul.h"

#include <array>
#include <cstddef>
#include <vector>

#include "shardwise/cuda/gemm/blas.h"
#include "shardwise/cuda/common/kernel_args.h"
#include "shardwise/tensor/broadcast.h"
#include "shardwise/tensor/device_copy.h"

namespace shardwise::cuda {

namespace {

// The matmul's sizes (ops/matmul/kernels.h's MatmulDims, as far as the GEMMs need them).
struct Dims {
  int64_t m = 1, k = 0, n = 1;
  bool tx = false, ty = false;
  Shape x_batch, y_batch, batch, out;
};

Shape leading(const Shape& s, int drop) { return Shape(s.span().first(static_cast<size_t>(s.ndim() - drop))); }

Dims dims_of(const Tensor& x, const Tensor& y, const MatmulOptions& o) {
  for (const Tensor* t : {&x, &y}) {
    SW_CHECK(t->defined() && t->on_device() && t->device() == x.device() &&
                 (t->dtype() == DType::F32 || t->dtype() == DType::BF16) && t->dtype() == x.dtype() && t->ndim() >= 1,
             "cuda matmul: x and y must be f32 or bf16 tensors of one dtype, rank >= 1, on one device; got x {}, y {}",
             x.defined() ? x.to_string(0) : "undefined", y.defined() ? y.to_string(0) : "undefined");
  }
  const Shape &xs = x.shape(), &ys = y.shape();
  const bool xv = xs.ndim() == 1, yv = ys.ndim() == 1;
  Dims d;
  d.tx = o.trans_x && !xv;
  d.ty = o.trans_y && !yv;
  const int64_t kx = xv ? xs[0] : xs[xs.ndim() - (d.tx ? 2 : 1)];
  const int64_t ky = yv ? ys[0] : ys[ys.ndim() - (d.ty ? 1 : 2)];
  SW_CHECK(kx == ky, "cuda matmul: x {} (trans_x={}) and y {} (trans_y={}) disagree on the contracted dim: {} vs {}",
           xs.to_string(), o.trans_x, ys.to_string(), o.trans_y, kx, ky);
  d.k = kx;
  if (!xv) d.m = xs[xs.ndim() - (d.tx ? 1 : 2)];
  if (!yv) d.n = ys[ys.ndim() - (d.ty ? 2 : 1)];
  d.x_batch = xv ? Shape{} : leading(xs, 2);
  d.y_batch = yv ? Shape{} : leading(ys, 2);
  d.batch = broadcast_shapes(d.x_batch, d.y_batch);
  d.out = d.batch;
  if (!xv) d.out.push_back(d.m);
  if (!yv) d.out.push_back(d.n);
  // A batch of x times a y without one: one GEMM of [batch * m, k] x [k, n].
  if (!d.tx && d.y_batch.ndim() == 0 && d.x_batch.ndim() > 0) {
    d.m *= d.batch.numel();
    d.batch = d.x_batch = Shape{};
  }
  return d;
}

const std::byte* at(const Tensor& t, int64_t elems) {
  return static_cast<const std::byte*>(t.device_ptr()) + elems * static_cast<int64_t>(dtype_size(t.dtype()));
}
std::byte* at(Tensor& t, int64_t elems) {
  return static_cast<std::byte*>(t.device_ptr()) + elems * static_cast<int64_t>(dtype_size(t.dtype()));
}

// One GEMM c = op(a) op(b) (+ c) per output batch item, or one strided-batched GEMM when every
// operand is whole (an item per output item) or single (one item for all). `a_batch` / `b_batch` /
// `c_batch` are the operands' batch shapes, `*_mat` their matrix sizes; an operand whose batch is
// broadcast accumulates (beta = 1 after its first product).
struct Operand {
  const Tensor* t;
  Shape batch;
  int64_t mat;
};
void batched(const Dims& d, GemmSpec spec, const Operand& a, const Operand& b, Tensor& c, const Shape& c_batch,
             int64_t c_mat, Stream stream) {
  const int64_t items = d.batch.numel();
  if (items == 0) return;
  const Device dev = c.device();
  auto whole = [&](const Shape& s) { return s.numel() == items; };
  auto single = [&](const Shape& s) { return s.numel() == 1; };
  if (whole(c_batch) && (whole(a.batch) || single(a.batch)) && (whole(b.batch) || single(b.batch))) {
    spec.batch = items;
    spec.stride_a = whole(a.batch) ? a.mat : 0;
    spec.stride_b = whole(b.batch) ? b.mat : 0;
    spec.stride_c = items > 1 ? c_mat : 0;
    gemm(dev, stream, spec, a.t->device_ptr(), b.t->device_ptr(), c.device_ptr());
    return;
  }
  std::vector<uint8_t> done(static_cast<size_t>(c_batch.numel()), 0);
  broadcast_for_each<3>(d.batch, {a.batch, b.batch, c_batch}, [&](int64_t, const std::array<int64_t, 3>& off) {
    GemmSpec one = spec;
    one.beta = done[static_cast<size_t>(off[2])] ? 1.0f : 0.0f;
    done[static_cast<size_t>(off[2])] = 1;
    gemm(dev, stream, one, at(*a.t, off[0] * a.mat), at(*b.t, off[1] * b.mat), at(c, off[2] * c_mat));
  });
}

GemmSpec spec_of(DType t, bool ta, bool tb, int64_t m, int64_t n, int64_t k, bool tf32) {
  return {.in = t, .out = t, .trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .tf32 = tf32};
}

}  // namespace

Tensor matmul(const Tensor& x, const Tensor& y, const MatmulOptions& o, Stream stream) {
  const Dims d = dims_of(x, y, o);
  Tensor out = empty_on(x.dtype(), d.out, x.device(), stream);
  if (out.numel() == 0) return out;
  if (d.k == 0) return zeros_on(x.dtype(), d.out, x.device(), stream);
  const GemmSpec s = spec_of(x.dtype(), d.tx, d.ty, d.m, d.n, d.k, o.tf32);
  batched(d, s, {&x, d.x_batch, d.m * d.k}, {&y, d.y_batch, d.k * d.n}, out, d.batch, d.m * d.n, stream);
  return out;
}

MatmulGrads matmul_backward(const Tensor& x, const Tensor& y, const Tensor& dout, const MatmulOptions& o, bool want_dx,
                            bool want_dy, Stream stream) {
  const Dims d = dims_of(x, y, o);
  detail::need("matmul_backward", "dout", dout, x.dtype(), x.device());
  detail::need_shape("matmul_backward", "dout", dout, d.out);
  const DType t = x.dtype();
  const Operand ox{&x, d.x_batch, d.m * d.k}, oy{&y, d.y_batch, d.k * d.n}, od{&dout, d.batch, d.m * d.n};
  MatmulGrads g;
  // A gradient no product reaches (an empty batch, k = 0 elsewhere) stays zero.
  if (want_dx) {
    g.dx = zeros_on(t, x.shape(), x.device(), stream);
    // dx [m, k] = dout op(y)^T, or stored [k, m] = op(y) dout^T when trans_x.
    if (d.tx) {
      batched(d, spec_of(t, d.ty, true, d.k, d.m, d.n, o.tf32), oy, od, g.dx, d.x_batch, d.m * d.k, stream);
    } else {
      batched(d, spec_of(t, false, !d.ty, d.m, d.k, d.n, o.tf32), od, oy, g.dx, d.x_batch, d.m * d.k, stream);
    }
  }
  if (want_dy) {
    g.dy = zeros_on(t, y.shape(), y.device(), stream);
    // dy [k, n] = op(x)^T dout, or stored [n, k] = dout^T op(x) when trans_y.
    if (d.ty) {
      batched(d, spec_of(t, true, d.tx, d.n, d.k, d.m, o.tf32), od, ox, g.dy, d.y_batch, d.k * d.n, stream);
    } else {
      batched(d, spec_of(t, !d.tx, false, d.k, d.n, d.m, o.tf32), ox, od, g.dy, d.y_batch, d.k * d.n, stream);
    }
  }
  return g;
}

}  // namespace shardwise::cuda
