#include "shardwise/ops/norm/kernels.h"

#include <algorithm>
#include <cmath>
#include <variant>
#include <vector>

#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

int norm_begin_axis(const Attrs& attrs, int ndim, std::string_view op) {
  return resolve_norm_axis(attrs.get_int("begin_norm_axis", -1), ndim, op);
}

int resolve_norm_axis(int64_t k, int ndim, std::string_view op) {
  SW_CHECK(ndim >= 1, "{}: x must have at least one dim, got a scalar", op);
  SW_CHECK(k >= -ndim && k < ndim,
           "{}: begin_norm_axis {} is out of range for x of rank {} (allowed {}..{}; dims [k, ndim) are normalized)",
           op, k, ndim, -ndim, ndim - 1);
  return static_cast<int>(k < 0 ? k + ndim : k);
}

Shape norm_leading_shape(const Shape& x, int k) {
  Shape out;
  for (int d = 0; d < k; ++d) out.push_back(x[d]);
  return out;
}

Shape norm_trailing_shape(const Shape& x, int k) {
  Shape out;
  for (int d = k; d < x.ndim(); ++d) out.push_back(x[d]);
  return out;
}

DType norm_stat_dtype(DType x) { return x == DType::F16 || x == DType::BF16 ? DType::F32 : x; }

void check_norm_param(std::string_view op, std::string_view what, const Shape& x_shape, DType x_dtype, int k,
                      const Shape& param_shape, DType param_dtype) {
  SW_CHECK(is_floating(x_dtype), "{}: x must have a floating dtype (f32, f64, f16, bf16), got {}", op,
           dtype_name(x_dtype));
  SW_CHECK(param_dtype == x_dtype, "{}: {} must have x's dtype {}, got {}", op, what, dtype_name(x_dtype),
           dtype_name(param_dtype));
  Shape want = norm_trailing_shape(x_shape, k);
  SW_CHECK(param_shape == want,
           "{}: {} must have the normalized shape x.shape[{}:] = {} (x is {}, begin_norm_axis {}), got {}", op, what,
           k, want.to_string(), x_shape.to_string(), k, param_shape.to_string());
}

namespace {

template <class T>
double to_f64(T v) {
  return static_cast<double>(static_cast<compute_t<T>>(v));
}
template <class T>
T from_f64(double v) {
  return static_cast<T>(static_cast<compute_t<T>>(v));
}

struct RowView {
  int64_t rows = 0, cols = 0;
};

RowView rows_of(const Shape& x, int k) {
  RowView v{1, 1};
  for (int d = 0; d < x.ndim(); ++d) (d < k ? v.rows : v.cols) *= x[d];
  return v;
}

void check_defined(std::string_view op, std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  for (const auto& [name, t] : tensors) SW_CHECK(t->defined(), "{}: {} is undefined", op, name);
}

void check_stat(std::string_view op, const char* what, const Tensor& stat, const Tensor& x, int k) {
  Shape want = norm_leading_shape(x.shape(), k);
  SW_CHECK(stat.shape() == want && stat.dtype() == norm_stat_dtype(x.dtype()),
           "{}: {} must be {} {} (x.shape[:{}] for x {}), got {} {}", op, what,
           dtype_name(norm_stat_dtype(x.dtype())), want.to_string(), k, x.shape().to_string(),
           dtype_name(stat.dtype()), stat.shape().to_string());
}

void check_dout(std::string_view op, const Tensor& dout, const Tensor& x) {
  SW_CHECK(dout.shape() == x.shape() && dout.dtype() == x.dtype(), "{}: dout must be {} {} like x, got {} {}", op,
           dtype_name(x.dtype()), x.shape().to_string(), dtype_name(dout.dtype()), dout.shape().to_string());
}

// Rows (of `cols` elements each) per thread at least: about kParallelGrain elements.
int64_t row_grain(int64_t cols) { return kParallelGrain / std::max<int64_t>(cols, 1) + 1; }

// Calls fn.template operator()<T>() for a floating dtype; Error naming `op` otherwise.
template <class Fn>
void dispatch_float(DType dtype, std::string_view op, Fn&& fn) {
  SW_DISPATCH(dtype, [&] {
    if constexpr (is_float_v<T>) {
      fn.template operator()<T>();
    } else {
      fail("{}: needs a floating dtype (f32, f64, f16, bf16), got {}", op, dtype_name(dtype));
    }
  });
}

}  // namespace

LayerNormOutputs layer_norm(const Tensor& x, const Tensor& scale, const Tensor& bias, int k, double epsilon) {
  check_defined("layer_norm", {{"x", &x}, {"scale", &scale}, {"bias", &bias}});
  k = resolve_norm_axis(k, x.ndim(), "layer_norm");
  check_norm_param("layer_norm", "scale", x.shape(), x.dtype(), k, scale.shape(), scale.dtype());
  check_norm_param("layer_norm", "bias", x.shape(), x.dtype(), k, bias.shape(), bias.dtype());
  LayerNormOutputs r{Tensor::uninitialized(x.dtype(), x.shape()), Tensor(norm_stat_dtype(x.dtype()), norm_leading_shape(x.shape(), k)),
                     Tensor(norm_stat_dtype(x.dtype()), norm_leading_shape(x.shape(), k))};
  auto [rows, cols] = rows_of(x.shape(), k);
  dispatch_float(x.dtype(), "layer_norm", [&]<class T>() {
    using S = compute_t<T>;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    const T* pb = bias.data<T>();
    T* po = r.out.data<T>();
    S* pm = r.mean.data<S>();
    S* pr = r.rstd.data<S>();
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const T* xr = px + row * cols;
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += to_f64(xr[c]);
      double mu = sum / static_cast<double>(cols);
      double var = 0;
      for (int64_t c = 0; c < cols; ++c) {
        double d = to_f64(xr[c]) - mu;
        var += d * d;
      }
      var /= static_cast<double>(cols);
      double rs = 1.0 / std::sqrt(var + epsilon);
      pm[row] = static_cast<S>(mu);
      pr[row] = static_cast<S>(rs);
      T* orow = po + row * cols;
      for (int64_t c = 0; c < cols; ++c) {
        orow[c] = from_f64<T>((to_f64(xr[c]) - mu) * rs * to_f64(ps[c]) + to_f64(pb[c]));
      }
    }
    });
  });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& dout, int k) {
  const char* op = "layer_norm backward";
  check_defined(op, {{"x", &x}, {"scale", &scale}, {"mean", &mean}, {"rstd", &rstd}, {"dout", &dout}});
  k = resolve_norm_axis(k, x.ndim(), op);
  check_norm_param(op, "scale", x.shape(), x.dtype(), k, scale.shape(), scale.dtype());
  check_stat(op, "mean", mean, x, k);
  check_stat(op, "rstd", rstd, x, k);
  check_dout(op, dout, x);
  LayerNormGrads g{Tensor::uninitialized(x.dtype(), x.shape()), Tensor(x.dtype(), scale.shape()), Tensor(x.dtype(), scale.shape())};
  auto [rows, cols] = rows_of(x.shape(), k);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    using S = compute_t<T>;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    const T* pdy = dout.data<T>();
    const S* pm = mean.data<S>();
    const S* pr = rstd.data<S>();
    T* pdx = g.dx.data<T>();
    std::vector<double> dscale(static_cast<size_t>(cols)), dbias(static_cast<size_t>(cols));
    const double n = static_cast<double>(cols);
    // dx: rows split over the threads. dscale, dbias: summed over the rows in order, in the row
    // loop when it runs whole, else in a second pass with the columns split: the same sums.
    bool whole = false;
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
      const bool fused = r0 == 0 && r1 == rows;
      if (fused) whole = true;  // only when this is the one piece
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t base = row * cols;
        const double mu = static_cast<double>(pm[row]), rs = static_cast<double>(pr[row]);
        double sum_g = 0, sum_gx = 0;
        for (int64_t c = 0; c < cols; ++c) {
          double dy = to_f64(pdy[base + c]);
          double xh = (to_f64(px[base + c]) - mu) * rs;
          double gv = dy * to_f64(ps[c]);
          sum_g += gv;
          sum_gx += gv * xh;
          if (fused) {
            dscale[static_cast<size_t>(c)] += dy * xh;
            dbias[static_cast<size_t>(c)] += dy;
          }
        }
        const double mean_g = sum_g / n, mean_gx = sum_gx / n;
        for (int64_t c = 0; c < cols; ++c) {
          double xh = (to_f64(px[base + c]) - mu) * rs;
          double gv = to_f64(pdy[base + c]) * to_f64(ps[c]);
          pdx[base + c] = from_f64<T>(rs * (gv - mean_g - xh * mean_gx));
        }
      }
    });
    if (!whole) parallel_columns(cols, row_grain(rows), [&](int64_t c0, int64_t c1) {
      const int64_t w = c1 - c0;
      std::vector<double> ds_sums(static_cast<size_t>(w)), db_sums(static_cast<size_t>(w));
      double* ds = ds_sums.data();
      double* db = db_sums.data();
      for (int64_t row = 0; row < rows; ++row) {
        const T* dyr = pdy + row * cols + c0;
        const T* xr = px + row * cols + c0;
        const double mu = static_cast<double>(pm[row]), rs = static_cast<double>(pr[row]);
        for (int64_t c = 0; c < w; ++c) {
          double dy = to_f64(dyr[c]);
          ds[c] += dy * ((to_f64(xr[c]) - mu) * rs);
          db[c] += dy;
        }
      }
      std::copy(ds, ds + w, dscale.begin() + c0);
      std::copy(db, db + w, dbias.begin() + c0);
    });
    T* pds = g.dscale.data<T>();
    T* pdb = g.dbias.data<T>();
    for (int64_t c = 0; c < cols; ++c) {
      pds[c] = from_f64<T>(dscale[static_cast<size_t>(c)]);
      pdb[c] = from_f64<T>(dbias[static_cast<size_t>(c)]);
    }
  });
  return g;
}

RmsNormOutputs rms_norm(const Tensor& x, const Tensor& scale, int k, double epsilon) {
  check_defined("rms_norm", {{"x", &x}, {"scale", &scale}});
  k = resolve_norm_axis(k, x.ndim(), "rms_norm");
  check_norm_param("rms_norm", "scale", x.shape(), x.dtype(), k, scale.shape(), scale.dtype());
  RmsNormOutputs r{Tensor::uninitialized(x.dtype(), x.shape()), Tensor(norm_stat_dtype(x.dtype()), norm_leading_shape(x.shape(), k))};
  auto [rows, cols] = rows_of(x.shape(), k);
  dispatch_float(x.dtype(), "rms_norm", [&]<class T>() {
    using S = compute_t<T>;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    T* po = r.out.data<T>();
    S* pi = r.inv_rms.data<S>();
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const T* xr = px + row * cols;
        double sq = 0;
        for (int64_t c = 0; c < cols; ++c) sq += to_f64(xr[c]) * to_f64(xr[c]);
        double inv = 1.0 / std::sqrt(sq / static_cast<double>(cols) + epsilon);
        pi[row] = static_cast<S>(inv);
        T* orow = po + row * cols;
        for (int64_t c = 0; c < cols; ++c) orow[c] = from_f64<T>(to_f64(xr[c]) * inv * to_f64(ps[c]));
      }
    });
  });
  return r;
}

RmsNormGrads rms_norm_backward(const Tensor& x, const Tensor& scale, const Tensor& inv_rms, const Tensor& dout,
                               int k) {
  const char* op = "rms_norm backward";
  check_defined(op, {{"x", &x}, {"scale", &scale}, {"inv_rms", &inv_rms}, {"dout", &dout}});
  k = resolve_norm_axis(k, x.ndim(), op);
  check_norm_param(op, "scale", x.shape(), x.dtype(), k, scale.shape(), scale.dtype());
  check_stat(op, "inv_rms", inv_rms, x, k);
  check_dout(op, dout, x);
  RmsNormGrads g{Tensor::uninitialized(x.dtype(), x.shape()), Tensor(x.dtype(), scale.shape())};
  auto [rows, cols] = rows_of(x.shape(), k);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    using S = compute_t<T>;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    const T* pdy = dout.data<T>();
    const S* pi = inv_rms.data<S>();
    T* pdx = g.dx.data<T>();
    std::vector<double> dscale(static_cast<size_t>(cols));
    const double n = static_cast<double>(cols);
    // dx: rows split over the threads; dscale as in layer_norm_backward.
    bool whole = false;
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
      const bool fused = r0 == 0 && r1 == rows;
      if (fused) whole = true;  // only when this is the one piece
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t base = row * cols;
        const double inv = static_cast<double>(pi[row]);
        double sum_gx = 0;
        for (int64_t c = 0; c < cols; ++c) {
          double dy = to_f64(pdy[base + c]);
          double xh = to_f64(px[base + c]) * inv;
          sum_gx += dy * to_f64(ps[c]) * xh;
          if (fused) dscale[static_cast<size_t>(c)] += dy * xh;
        }
        const double mean_gx = sum_gx / n;
        for (int64_t c = 0; c < cols; ++c) {
          double xh = to_f64(px[base + c]) * inv;
          double gv = to_f64(pdy[base + c]) * to_f64(ps[c]);
          pdx[base + c] = from_f64<T>(inv * (gv - xh * mean_gx));
        }
      }
    });
    if (!whole) parallel_columns(cols, row_grain(rows), [&](int64_t c0, int64_t c1) {
      const int64_t w = c1 - c0;
      std::vector<double> ds_sums(static_cast<size_t>(w));
      double* ds = ds_sums.data();
      for (int64_t row = 0; row < rows; ++row) {
        const T* dyr = pdy + row * cols + c0;
        const T* xr = px + row * cols + c0;
        const double inv = static_cast<double>(pi[row]);
        for (int64_t c = 0; c < w; ++c) ds[c] += to_f64(dyr[c]) * (to_f64(xr[c]) * inv);
      }
      std::copy(ds, ds + w, dscale.begin() + c0);
    });
    T* pds = g.dscale.data<T>();
    for (int64_t c = 0; c < cols; ++c) pds[c] = from_f64<T>(dscale[static_cast<size_t>(c)]);
  });
  return g;
}

}  // namespace shardwise::ops
