// matmul(x, y; trans_x, trans_y): PaddlePaddle / NumPy matmul with broadcast batch dims and 1-D
// operands (see MatmulDims in tensor/gemm.h). Kernels run one GEMM per output batch item.
#include <algorithm>
#include <array>
#include <cstring>

#include "shardwise/ops/families.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise::ops {

namespace {

struct MatmulAttrs {
  bool trans_x = false, trans_y = false;
};

MatmulAttrs read_attrs(const Attrs& attrs) {
  return {attrs.get_bool("trans_x", false), attrs.get_bool("trans_y", false)};
}

MatmulDims checked_dims(const Shape& x, DType xt, const Shape& y, DType yt, const Attrs& attrs) {
  SW_CHECK(xt == yt, "matmul: x {} holds {} but y {} holds {} (allowed: the same dtype)", x.to_string(),
           dtype_name(xt), y.to_string(), dtype_name(yt));
  SW_CHECK(gemm_supports(xt), "matmul does not support {} (allowed: f32, f64, f16, bf16, i32, i64)",
           dtype_name(xt));
  MatmulAttrs a = read_attrs(attrs);
  return matmul_dims(x, y, a.trans_x, a.trans_y);
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
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.beta = beta;
  return resolve_gemm_args(g);
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

std::vector<TensorMeta> matmul_infer(std::span<const TensorMeta> in, const Attrs& attrs) {
  MatmulDims d = checked_dims(in[0].shape, in[0].dtype, in[1].shape, in[1].dtype, attrs);
  return {TensorMeta{d.out, in[0].dtype}};
}

std::vector<Tensor> matmul_forward(std::span<const Tensor> in, const Attrs& attrs) {
  SW_CHECK(in.size() == 2, "matmul takes 2 inputs, got {}", in.size());
  const Tensor& x = in[0];
  const Tensor& y = in[1];
  const MatmulDims d = folded(checked_dims(x.shape(), x.dtype(), y.shape(), y.dtype(), attrs));
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
  const MatmulDims full = checked_dims(x.shape(), x.dtype(), y.shape(), y.dtype(), attrs);
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

std::vector<Tensor> matmul_backward(std::span<const Tensor> in, std::span<const Tensor> /*outputs*/,
                                    std::span<const Tensor> out_grads, const Attrs& attrs) {
  return matmul_grads(in, out_grads, attrs, true, true);
}

VerifyCase make_case(Shape x, Shape y, DType dtype, bool trans_x = false, bool trans_y = false) {
  VerifyCase c;
  c.shapes = {x, y};
  c.dtypes = {dtype, dtype};
  if (trans_x) c.attrs.set("trans_x", true);
  if (trans_y) c.attrs.set("trans_y", true);
  return c;
}

std::vector<VerifyCase> matmul_cases() {
  return {
      make_case({12, 6}, {6, 12}, DType::F64),                 // every dim divides every test mesh
      make_case({5, 7}, {7, 3}, DType::F64),                   // uneven shards
      make_case({6, 2}, {2, 5}, DType::F64),                   // k = 2 < 3: empty k shards give zeros
      make_case({7, 5}, {7, 3}, DType::F64, true, false),      // trans_x: x is [k, m]
      make_case({5, 7}, {3, 7}, DType::F32, false, true),      // trans_y: y is [n, k]; f32
      make_case({2, 5, 3}, {3, 4}, DType::F64),                // batched x, broadcast y
      make_case({1, 4, 3}, {2, 3, 5}, DType::F64),             // size-1 batch dim broadcast
      make_case({7}, {7, 3}, DType::F64),                      // 1-D x: row vector
      make_case({5, 7}, {7}, DType::F64),                      // 1-D y: column vector
      make_case({12}, {12}, DType::F64),                       // dot product; 12 divides every mesh size
      make_case({2, 7, 3}, {2, 4, 7}, DType::I64, true, true), // exact integers, both transposed
  };
}

}  // namespace

void register_matmul_ops(OpRegistry& registry) {
  OpDef op;
  op.name = "matmul";
  op.family = "matmul";
  op.rule = "matmul";
  op.summary =
      "matmul(x, y; trans_x, trans_y): x [..., m, k] * y [..., k, n] with broadcast batch dims; 1-D x / y are "
      "row / column vectors (their m / n dim dropped); f32/f64 via OpenBLAS, f16/bf16/i32/i64 reference loops";
  op.num_inputs = 2;
  op.num_outputs = 1;
  op.infer = matmul_infer;
  op.forward = matmul_forward;
  op.backward = matmul_backward;
  op.backward_partial = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> out_grads,
                           const Attrs& attrs, std::span<const bool> wanted) {
    return matmul_grads(in, out_grads, attrs, wanted[0], wanted[1]);
  };
  op.backward_reads = std::vector<int>{0, 1};  // x and y; not the output
  op.cases = matmul_cases();
  registry.add(std::move(op));
}

}  // namespace shardwise::ops
