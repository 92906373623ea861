// The matmul kernels: one GEMM per output batch item through the GEMM wrapper (tensor/gemm.h).
#include "shardwise/ops/matmul/kernels.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "shardwise/core/error.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise::ops {

namespace {

struct MatmulAttrs {
  bool trans_x = false, trans_y = false;
};

MatmulAttrs read_attrs(const Attrs& attrs) {
  return {attrs.get_bool("trans_x", false), attrs.get_bool("trans_y", false)};
}


// Calls fn(x_offset, y_offset, out_offset) (elements) for every output batch item, in row-major
// order of the broadcast batch shape; a broadcast (size-1 or missing) batch dim has stride 0.
template <class F>
void for_each_batch(const MatmulDims& d, const Shape& xs, const Shape& ys, F&& fn) {
  int nb = d.batch.ndim();
  std::array<int64_t, kMaxDims> x_stride{}, y_stride{}, idx{};
  int64_t s = d.x_matrix();
  for (int j = d.x_batch_ndim - 1; j >= 0; --j) {
    x_stride[static_cast<size_t>(j + nb - d.x_batch_ndim)] = xs[j] == 1 ? 0 : s;
    s *= xs[j];
  }
  s = d.y_matrix();
  for (int j = d.y_batch_ndim - 1; j >= 0; --j) {
    y_stride[static_cast<size_t>(j + nb - d.y_batch_ndim)] = ys[j] == 1 ? 0 : s;
    s *= ys[j];
  }
  int64_t total = d.batch.numel();
  int64_t xo = 0, yo = 0;
  for (int64_t b = 0; b < total; ++b) {
    fn(xo, yo, b * d.out_matrix());
    for (int i = nb - 1; i >= 0; --i) {
      auto u = static_cast<size_t>(i);
      xo += x_stride[u];
      yo += y_stride[u];
      if (++idx[u] < d.batch[i]) break;
      xo -= x_stride[u] * idx[u];
      yo -= y_stride[u] * idx[u];
      idx[u] = 0;
    }
  }
}

const std::byte* at(const Tensor& t, int64_t offset) {
  return t.raw() + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}
std::byte* at(Tensor& t, int64_t offset) { return t.raw() + offset * static_cast<int64_t>(dtype_size(t.dtype())); }

GemmArgs args(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double beta) {
  return resolve_gemm_args(gemm_args(trans_a, trans_b, m, n, k, beta));
}

// x [..., m, k] (not transposed) times a y without batch dims: one GEMM with the batch folded into
// m ([batch * m, k] x [k, n]) instead of one per batch item. The rows are the same, the GEMM is
// larger (better blocked, y packed once) and dy is one product over every row.
MatmulDims folded(MatmulDims d) {
  if (d.x_vector || d.trans_x || d.y_batch_ndim != 0 || d.x_batch_ndim == 0) return d;
  d.m *= d.batch.numel();
  d.batch = Shape{};
  d.x_batch_ndim = 0;
  return d;
}

}  // namespace

MatmulDims matmul_dims(const Shape& x, const Shape& y, bool trans_x, bool trans_y) {
  SW_CHECK(x.ndim() >= 1 && y.ndim() >= 1, "matmul: x {} and y {} must both have rank >= 1", x.to_string(),
           y.to_string());
  MatmulDims d;
  d.x_vector = x.ndim() == 1;
  d.y_vector = y.ndim() == 1;
  d.trans_x = trans_x && !d.x_vector;
  d.trans_y = trans_y && !d.y_vector;
  int64_t kx;
  if (d.x_vector) {
    kx = x[0];
  } else {
    d.m = d.trans_x ? x[x.ndim() - 1] : x[x.ndim() - 2];
    kx = d.trans_x ? x[x.ndim() - 2] : x[x.ndim() - 1];
  }
  int64_t ky;
  if (d.y_vector) {
    ky = y[0];
  } else {
    ky = d.trans_y ? y[y.ndim() - 1] : y[y.ndim() - 2];
    d.n = d.trans_y ? y[y.ndim() - 2] : y[y.ndim() - 1];
  }
  SW_CHECK(kx == ky,
           "matmul: x {} (trans_x={}) and y {} (trans_y={}) disagree on the contracted dim: {} vs {}",
           x.to_string(), trans_x, y.to_string(), trans_y, kx, ky);
  d.k = kx;
  d.x_batch_ndim = d.x_vector ? 0 : x.ndim() - 2;
  d.y_batch_ndim = d.y_vector ? 0 : y.ndim() - 2;
  int nb = std::max(d.x_batch_ndim, d.y_batch_ndim);
  for (int i = 0; i < nb; ++i) {
    int xi = i - (nb - d.x_batch_ndim), yi = i - (nb - d.y_batch_ndim);
    int64_t xe = xi >= 0 ? x[xi] : 1, ye = yi >= 0 ? y[yi] : 1;
    SW_CHECK(xe == ye || xe == 1 || ye == 1,
             "matmul: batch dims of x {} and y {} do not broadcast ({} vs {} at output batch dim {})", x.to_string(),
             y.to_string(), xe, ye, i);
    d.batch.push_back(xe == 1 ? ye : xe);
  }
  d.out = d.batch;
  if (!d.x_vector) d.out.push_back(d.m);
  if (!d.y_vector) d.out.push_back(d.n);
  return d;
}

MatmulDims matmul_checked_dims(const Shape& x, DType xt, const Shape& y, DType yt, const Attrs& attrs) {
  SW_CHECK(xt == yt, "matmul: x {} holds {} but y {} holds {} (allowed: the same dtype)", x.to_string(),
           dtype_name(xt), y.to_string(), dtype_name(yt));
  SW_CHECK(gemm_supports(xt), "matmul does not support {} (allowed: f32, f64, f16, bf16, i32, i64)",
           dtype_name(xt));
  MatmulAttrs a = read_attrs(attrs);
  return matmul_dims(x, y, a.trans_x, a.trans_y);
}

std::vector<Tensor> matmul_forward(std::span<const Tensor> in, const Attrs& attrs) {
  SW_CHECK(in.size() == 2, "matmul takes 2 inputs, got {}", in.size());
  const Tensor& x = in[0];
  const Tensor& y = in[1];
  const MatmulDims d = folded(matmul_checked_dims(x.shape(), x.dtype(), y.shape(), y.dtype(), attrs));
  Tensor out = Tensor::uninitialized(x.dtype(), d.out);  // beta = 0: every output matrix is written once
  GemmArgs g = args(d.trans_x, d.trans_y, d.m, d.n, d.k, 0.0);
  for_each_batch(d, x.shape(), y.shape(), [&](int64_t xo, int64_t yo, int64_t oo) {
    gemm(x.dtype(), g, at(x, xo), at(y, yo), at(out, oo));
  });
  return {out};
}


// dx = dout * op(y)^T and dy = op(x)^T * dout, written in each input's stored layout (transposed
// when its trans flag is set). The first product into a matrix of dx / dy has beta = 0, later ones
// beta = 1: they accumulate the sum over the batch items an input was broadcast to. want_dx /
// want_dy leave a gradient undefined (a zero-bubble schedule computes them at different times).
std::vector<Tensor> matmul_grads(std::span<const Tensor> in, std::span<const Tensor> out_grads, const Attrs& attrs,
                                 bool want_dx, bool want_dy) {
  SW_CHECK(in.size() == 2 && out_grads.size() == 1, "matmul backward takes 2 inputs and 1 output grad");
  const Tensor& x = in[0];
  const Tensor& y = in[1];
  const Tensor& dout = out_grads[0];
  const MatmulDims full = matmul_checked_dims(x.shape(), x.dtype(), y.shape(), y.dtype(), attrs);
  SW_CHECK(dout.defined() && dout.dtype() == x.dtype() && dout.shape() == full.out,
           "matmul backward: dout must be {} {} like the output, got {}", dtype_name(x.dtype()), full.out.to_string(),
           dout.defined() ? fmt::format("{} {}", dtype_name(dout.dtype()), dout.shape().to_string()) : "undefined");
  const MatmulDims d = folded(full);
  bool tx = d.trans_x, ty = d.trans_y;
  // dx: [m, k] = dout [m, n] * op(y)^T, or stored [k, m] = op(y) * dout^T when trans_x.
  auto x_args = [&](double beta) {
    return tx ? args(ty, true, d.k, d.m, d.n, beta) : args(false, !ty, d.m, d.k, d.n, beta);
  };
  // dy: [k, n] = op(x)^T * dout, or stored [n, k] = dout^T * op(x) when trans_y.
  auto y_args = [&](double beta) {
    return ty ? args(true, tx, d.n, d.k, d.m, beta) : args(!tx, false, d.k, d.n, d.m, beta);
  };
  const GemmArgs gx[2] = {x_args(0.0), x_args(1.0)}, gy[2] = {y_args(0.0), y_args(1.0)};
  Tensor dx, dy;
  if (want_dx) dx = Tensor::uninitialized(x.dtype(), x.shape());
  if (want_dy) dy = Tensor::uninitialized(y.dtype(), y.shape());
  // Which matrices of dx / dy hold a product already (their offsets are multiples of a matrix).
  const int64_t x_mat = std::max<int64_t>(d.x_matrix(), 1), y_mat = std::max<int64_t>(d.y_matrix(), 1);
  std::vector<uint8_t> x_done(static_cast<size_t>(std::max<int64_t>(x.numel() / x_mat, 1)), 0);
  std::vector<uint8_t> y_done(static_cast<size_t>(std::max<int64_t>(y.numel() / y_mat, 1)), 0);
  DType dt = x.dtype();
  for_each_batch(d, x.shape(), y.shape(), [&](int64_t xo, int64_t yo, int64_t oo) {
    if (want_dx) {
      const GemmArgs& ga = gx[x_done[static_cast<size_t>(xo / x_mat)]];
      x_done[static_cast<size_t>(xo / x_mat)] = 1;
      if (tx) {
        gemm(dt, ga, at(y, yo), at(dout, oo), at(dx, xo));
      } else {
        gemm(dt, ga, at(dout, oo), at(y, yo), at(dx, xo));
      }
    }
    if (want_dy) {
      const GemmArgs& gb = gy[y_done[static_cast<size_t>(yo / y_mat)]];
      y_done[static_cast<size_t>(yo / y_mat)] = 1;
      if (ty) {
        gemm(dt, gb, at(dout, oo), at(x, xo), at(dy, yo));
      } else {
        gemm(dt, gb, at(x, xo), at(dout, oo), at(dy, yo));
      }
    }
  });
  // A matrix no product reached (an empty output batch) is zero.
  auto zero_rest = [](Tensor& t, const std::vector<uint8_t>& done, int64_t mat) {
    if (!t.defined() || t.numel() == 0) return;
    const auto bytes = static_cast<size_t>(mat) * dtype_size(t.dtype());
    for (size_t i = 0; i < done.size(); ++i) {
      if (!done[i]) std::memset(t.raw() + i * bytes, 0, bytes);
    }
  };
  zero_rest(dx, x_done, x_mat);
  zero_rest(dy, y_done, y_mat);
  return {dx, dy};
}

}  // namespace shardwise::ops
