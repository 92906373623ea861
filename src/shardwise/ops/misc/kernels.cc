#include "shardwise/ops/misc/kernels.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <variant>
#include <vector>

#include "shardwise/core/philox.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

namespace {

// A tensor viewed as [outer, n, inner] around one axis: element (o, j, i) sits at
// (o * n + j) * inner + i.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
  AxisView(const Shape& shape, int axis) {
    for (int d = 0; d < shape.ndim(); ++d) {
      if (d < axis) outer *= shape[d];
      if (d > axis) inner *= shape[d];
    }
    n = shape[axis];
  }
};

void check_axis_in(std::string_view op, const Tensor& t, int axis) {
  SW_CHECK(t.defined(), "{}: the input tensor is undefined", op);
  SW_CHECK(axis >= 0 && axis < t.ndim(), "{}: axis {} is out of range for a tensor of rank {}", op, axis, t.ndim());
}

template <class T>
bool is_nan_value(T v) {
  if constexpr (is_float_v<T>) {
    return std::isnan(static_cast<compute_t<T>>(v));
  } else {
    return false;
  }
}

// Prefix sums along the axis (suffix sums when `reverse`): floats accumulate in double,
// integers in uint64 (wrapping).
template <class T>
void scan_typed(const T* x, T* y, const AxisView& v, bool reverse) {
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t i = 0; i < v.inner; ++i) {
      const int64_t base = o * v.n * v.inner + i;
      std::conditional_t<is_float_v<T>, double, uint64_t> acc = 0;
      for (int64_t step = 0; step < v.n; ++step) {
        const int64_t j = reverse ? v.n - 1 - step : step;
        const int64_t at = base + j * v.inner;
        if constexpr (is_float_v<T>) {
          acc += static_cast<double>(static_cast<compute_t<T>>(x[at]));
          y[at] = static_cast<T>(static_cast<compute_t<T>>(acc));
        } else {
          acc += static_cast<uint64_t>(static_cast<int64_t>(x[at]));
          y[at] = static_cast<T>(static_cast<int64_t>(acc));
        }
      }
    }
  }
}

Tensor scan(std::string_view op, const Tensor& x, int axis, bool reverse) {
  check_axis_in(op, x, axis);
  check_cumsum_dtype(x.dtype());
  Tensor y(x.dtype(), x.shape());
  AxisView v(x.shape(), axis);
  SW_DISPATCH(x.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) scan_typed<T>(x.data<T>(), y.data<T>(), v, reverse);
  });
  return y;
}

// First index of the max (want_max) or min; a NaN wins at its first occurrence.
template <class T>
void arg_reduce_typed(const T* x, int64_t* out, const AxisView& v, bool want_max) {
  using C = compute_t<T>;
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t i = 0; i < v.inner; ++i) {
      const T* s = x + o * v.n * v.inner + i;
      int64_t best = 0;
      C best_value = static_cast<C>(s[0]);
      for (int64_t j = 1; j < v.n && !is_nan_value(best_value); ++j) {
        C value = static_cast<C>(s[j * v.inner]);
        if (is_nan_value(value) || (want_max ? value > best_value : value < best_value)) {
          best = j;
          best_value = value;
        }
      }
      out[o * v.inner + i] = best;
    }
  }
}

Tensor arg_reduce(std::string_view op, const Tensor& x, int axis, bool keepdim, bool want_max) {
  check_axis_in(op, x, axis);
  check_arg_reduce_dtype(op, x.dtype());
  Tensor out(DType::I64, arg_reduce_shape(x.shape(), axis, keepdim));
  AxisView v(x.shape(), axis);
  SW_CHECK(v.n > 0 || out.numel() == 0, "{}: axis {} of the input {} is empty: there is no {} to return", op, axis,
           x.shape().to_string(), want_max ? "maximum" : "minimum");
  if (out.numel() == 0) return out;
  SW_DISPATCH(x.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) arg_reduce_typed<T>(x.data<T>(), out.data<int64_t>(), v, want_max);
  });
  return out;
}

template <class T>
void topk_typed(const T* x, T* values, int64_t* indices, const AxisView& v, const TopkArgs& a) {
  using C = compute_t<T>;
  std::vector<C> slice(static_cast<size_t>(v.n));
  std::vector<int64_t> order(static_cast<size_t>(v.n));
  // "a before b": strictly better value, NaN the largest of all; equal values: lower index.
  auto greater = [](C a, C b) {
    bool na = is_nan_value(a), nb = is_nan_value(b);
    if (na || nb) return na && !nb;
    return a > b;
  };
  auto before = [&](int64_t ia, int64_t ib) {
    C va = slice[static_cast<size_t>(ia)], vb = slice[static_cast<size_t>(ib)];
    if (a.largest ? greater(va, vb) : greater(vb, va)) return true;
    if (a.largest ? greater(vb, va) : greater(va, vb)) return false;
    return ia < ib;
  };
  const auto k = static_cast<size_t>(a.k);
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t i = 0; i < v.inner; ++i) {
      const T* s = x + o * v.n * v.inner + i;
      for (int64_t j = 0; j < v.n; ++j) slice[static_cast<size_t>(j)] = static_cast<C>(s[j * v.inner]);
      std::iota(order.begin(), order.end(), int64_t{0});
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), before);
      if (!a.sorted) std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
      const int64_t out_base = o * a.k * v.inner + i;
      for (size_t j = 0; j < k; ++j) {
        int64_t src = order[j];
        values[out_base + static_cast<int64_t>(j) * v.inner] = s[src * v.inner];
        indices[out_base + static_cast<int64_t>(j) * v.inner] = src;
      }
    }
  }
}

template <class T>
void topk_backward_typed(const T* dvalues, const int64_t* indices, T* dx, const AxisView& xv, int64_t k,
                         const Shape& x_shape) {
  for (int64_t o = 0; o < xv.outer; ++o) {
    for (int64_t i = 0; i < xv.inner; ++i) {
      const int64_t in_base = o * k * xv.inner + i;
      const int64_t out_base = o * xv.n * xv.inner + i;
      for (int64_t j = 0; j < k; ++j) {
        int64_t idx = indices[in_base + j * xv.inner];
        SW_CHECK(idx >= 0 && idx < xv.n, "topk backward: index {} is out of range for the axis of x {} (extent {})",
                 idx, x_shape.to_string(), xv.n);
        T& slot = dx[out_base + idx * xv.inner];
        if constexpr (is_float_v<T>) {
          slot = static_cast<T>(static_cast<compute_t<T>>(slot) + static_cast<compute_t<T>>(dvalues[in_base + j * xv.inner]));
        } else {
          slot = static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(slot)) +
                                                     static_cast<uint64_t>(static_cast<int64_t>(dvalues[in_base + j * xv.inner]))));
        }
      }
    }
  }
}

}  // namespace

int misc_axis(const Attrs& attrs, int ndim, std::string_view op, std::optional<int64_t> fallback) {
  SW_CHECK(ndim >= 1, "{}: needs an input of rank >= 1, got a scalar", op);
  const AttrValue* value = attrs.find("axis");
  int64_t axis = 0;
  if (value == nullptr) {
    SW_CHECK(fallback.has_value(), "{}: attribute 'axis' (an int) is required", op);
    axis = *fallback;
  } else if (const auto* one = std::get_if<int64_t>(value)) {
    axis = *one;
  } else {
    fail("{}: attribute 'axis' must be a single int, got {}", op, attrs.to_string());
  }
  SW_CHECK(axis >= -ndim && axis < ndim, "{}: axis {} is out of range for a tensor of rank {} (allowed {}..{})", op,
           axis, ndim, -ndim, ndim - 1);
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

// ---- dropout ----

DropoutArgs dropout_args(const Attrs& attrs) {
  DropoutArgs a;
  a.p = attrs.get_float("p", 0.5);
  SW_CHECK(a.p >= 0.0 && a.p < 1.0, "dropout: p must be in [0, 1), got {}", a.p);
  SW_CHECK(attrs.has("seed"), "dropout: attribute 'seed' (an int) is required, got '{}'", attrs.to_string());
  a.seed = static_cast<uint64_t>(attrs.get_int("seed"));
  a.stream = static_cast<uint64_t>(attrs.get_int("stream", 0));
  a.training = attrs.get_bool("training", true);
  return a;
}

void check_dropout_dtype(DType dtype) {
  SW_CHECK(is_floating(dtype), "dropout: needs a floating dtype (f32, f64, f16, bf16), got {}", dtype_name(dtype));
}

Tensor dropout_mask(const Shape& local, const Shape& global_shape, std::span<const int64_t> offset,
                    const DropoutArgs& args) {
  const int nd = local.ndim();
  SW_CHECK(global_shape.ndim() == nd && offset.size() >= static_cast<size_t>(nd),
           "dropout: a local block of rank {} needs a global shape and an offset of the same rank, got {} and {} "
           "offsets",
           nd, global_shape.to_string(), offset.size());
  for (int d = 0; d < nd; ++d) {
    int64_t off = offset[static_cast<size_t>(d)];
    SW_CHECK(off >= 0 && off + local[d] <= global_shape[d],
             "dropout: the local block {} at offset {} of dim {} does not fit in the global shape {}",
             local.to_string(), off, d, global_shape.to_string());
  }
  Tensor mask(DType::U8, local);
  uint8_t* m = mask.data<uint8_t>();
  if (mask.numel() == 0) return mask;
  if (!args.training) {
    std::fill(m, m + mask.numel(), uint8_t{1});
    return mask;
  }
  const Philox rng(args.seed, args.stream);
  // Philox::uniform(g) itself (not a copy of its bit arithmetic), so the mask is by definition
  // the generator's stream at the global indices.
  auto keep = [&](uint64_t g) { return static_cast<double>(rng.uniform(g)) >= args.p; };
  if (nd == 0) {
    m[0] = keep(0) ? 1 : 0;
    return mask;
  }
  std::array<int64_t, kMaxDims> gstride = contiguous_strides(global_shape);
  // Odometer over every dim but the last; the last dim is the contiguous inner loop.
  const int last = nd - 1;
  const int64_t rows = mask.numel() / local[last];
  const int64_t inner_off = offset[static_cast<size_t>(last)];
  // Rows split over the rank's threads: each element's bit is a function of its global index.
  parallel_for(rows, kParallelGrain / 8 / std::max<int64_t>(local[last], 1) + 1, [&](int64_t r0, int64_t r1) {
  std::array<int64_t, kMaxDims> idx{};
  for (int64_t d = last - 1, q = r0; d >= 0; --d) {  // the odometer at row r0
    idx[static_cast<size_t>(d)] = q % local[static_cast<int>(d)];
    q /= local[static_cast<int>(d)];
  }
  for (int64_t r = r0; r < r1; ++r) {
    int64_t base = 0;
    for (int d = 0; d < last; ++d) {
      base += (offset[static_cast<size_t>(d)] + idx[static_cast<size_t>(d)]) * gstride[static_cast<size_t>(d)];
    }
    uint8_t* row = m + r * local[last];
    for (int64_t j = 0; j < local[last]; ++j) row[j] = keep(static_cast<uint64_t>(base + inner_off + j)) ? 1 : 0;
    for (int d = last - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < local[d]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  });
  return mask;
}

namespace {

// out = x * (mask ? scale : 0), in the compute type (x * 0 keeps NaN, like PyTorch's x * mask * scale).
template <class T>
void mask_typed(const T* in, const uint8_t* m, T* o, int64_t n, double scale) {
  if constexpr (is_float_v<T>) {
    using C = compute_t<T>;
    const C s = static_cast<C>(scale);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(static_cast<C>(in[i]) * (m[i] ? s : C(0)));
  }
}

Tensor apply_mask(std::string_view what, const Tensor& x, const Tensor& mask, double scale) {
  SW_CHECK(mask.dtype() == DType::U8 && mask.shape() == x.shape(), "{}: the mask must be u8 {}, got {} {}", what,
           x.shape().to_string(), dtype_name(mask.dtype()), mask.shape().to_string());
  Tensor out(x.dtype(), x.shape());
  SW_DISPATCH(x.dtype(), [&] {
    const T* in = x.data<T>();
    const uint8_t* m = mask.data<uint8_t>();
    T* o = out.data<T>();
    parallel_for(x.numel(), kParallelGrain, [&](int64_t b, int64_t e) { mask_typed<T>(in + b, m + b, o + b, e - b, scale); });
  });
  return out;
}

double keep_scale(const DropoutArgs& args) { return args.training ? 1.0 / (1.0 - args.p) : 1.0; }

}  // namespace

DropoutResult dropout(const Tensor& x, const Shape& global_shape, std::span<const int64_t> offset,
                      const DropoutArgs& args) {
  SW_CHECK(x.defined(), "dropout: the input tensor is undefined");
  check_dropout_dtype(x.dtype());
  SW_CHECK(args.p >= 0.0 && args.p < 1.0, "dropout: p must be in [0, 1), got {}", args.p);
  DropoutResult r;
  r.mask = dropout_mask(x.shape(), global_shape, offset, args);
  r.out = args.training ? apply_mask("dropout", x, r.mask, keep_scale(args)) : x.clone();
  return r;
}

DropoutResult dropout(const Tensor& x, const DropoutArgs& args) {
  SW_CHECK(x.defined(), "dropout: the input tensor is undefined");
  std::array<int64_t, kMaxDims> zero{};
  return dropout(x, x.shape(), std::span<const int64_t>(zero.data(), static_cast<size_t>(x.ndim())), args);
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, const DropoutArgs& args) {
  SW_CHECK(dy.defined() && mask.defined(), "dropout backward: dy and mask must be defined");
  check_dropout_dtype(dy.dtype());
  return apply_mask("dropout backward", dy, mask, keep_scale(args));
}

// ---- cumsum ----

void check_cumsum_dtype(DType dtype) {
  SW_CHECK(dtype != DType::Bool, "cumsum: bool tensors are not supported; convert to an integer dtype first");
}

Tensor cumsum(const Tensor& x, int axis) { return scan("cumsum", x, axis, false); }

Tensor cumsum_backward(const Tensor& dy, int axis) { return scan("cumsum backward", dy, axis, true); }

// ---- argmax / argmin ----

Shape arg_reduce_shape(const Shape& x, int axis, bool keepdim) {
  Shape out;
  for (int d = 0; d < x.ndim(); ++d) {
    if (d != axis) {
      out.push_back(x[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

void check_arg_reduce_dtype(std::string_view op, DType dtype) {
  SW_CHECK(dtype != DType::Bool, "{}: bool tensors are not supported; convert to an integer dtype first", op);
}

Tensor argmax(const Tensor& x, int axis, bool keepdim) { return arg_reduce("argmax", x, axis, keepdim, true); }

Tensor argmin(const Tensor& x, int axis, bool keepdim) { return arg_reduce("argmin", x, axis, keepdim, false); }

// ---- topk ----

TopkArgs topk_args(const Attrs& attrs, const Shape& x) {
  TopkArgs a;
  a.axis = misc_axis(attrs, x.ndim(), "topk", -1);
  SW_CHECK(attrs.has("k"), "topk: attribute 'k' (an int) is required, got '{}'", attrs.to_string());
  a.k = attrs.get_int("k");
  SW_CHECK(a.k >= 0 && a.k <= x[a.axis], "topk: k = {} must be in [0, {}] (the extent of axis {} of {})", a.k,
           x[a.axis], a.axis, x.to_string());
  a.largest = attrs.get_bool("largest", true);
  a.sorted = attrs.get_bool("sorted", true);
  return a;
}

void check_topk_dtype(DType dtype) {
  SW_CHECK(dtype != DType::Bool, "topk: bool tensors are not supported; convert to an integer dtype first");
}

TopkResult topk(const Tensor& x, const TopkArgs& args) {
  check_axis_in("topk", x, args.axis);
  check_topk_dtype(x.dtype());
  SW_CHECK(args.k >= 0 && args.k <= x.shape()[args.axis], "topk: k = {} must be in [0, {}] (axis {} of {})", args.k,
           x.shape()[args.axis], args.axis, x.shape().to_string());
  Shape out_shape = x.shape();
  out_shape[args.axis] = args.k;
  TopkResult r{Tensor(x.dtype(), out_shape), Tensor(DType::I64, out_shape)};
  if (r.values.numel() == 0) return r;
  AxisView v(x.shape(), args.axis);
  SW_DISPATCH(x.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      topk_typed<T>(x.data<T>(), r.values.data<T>(), r.indices.data<int64_t>(), v, args);
    }
  });
  return r;
}

Tensor topk_backward(const Shape& x_shape, const Tensor& dvalues, const Tensor& indices, int axis) {
  SW_CHECK(dvalues.defined() && indices.defined(), "topk backward: dvalues and indices must be defined");
  SW_CHECK(axis >= 0 && axis < x_shape.ndim(), "topk backward: axis {} is out of range for x {}", axis,
           x_shape.to_string());
  check_topk_dtype(dvalues.dtype());
  SW_CHECK(indices.dtype() == DType::I64 && indices.shape() == dvalues.shape(),
           "topk backward: indices must be i64 of the shape of dvalues {}, got {} {}", dvalues.shape().to_string(),
           dtype_name(indices.dtype()), indices.shape().to_string());
  Shape expect = x_shape;
  expect[axis] = dvalues.shape().ndim() == x_shape.ndim() ? dvalues.shape()[axis] : -1;
  SW_CHECK(dvalues.shape() == expect, "topk backward: dvalues {} does not match x {} outside axis {}",
           dvalues.shape().to_string(), x_shape.to_string(), axis);
  Tensor dx(dvalues.dtype(), x_shape);
  if (dvalues.numel() == 0) return dx;
  AxisView xv(x_shape, axis);
  SW_DISPATCH(dvalues.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      topk_backward_typed<T>(dvalues.data<T>(), indices.data<int64_t>(), dx.data<T>(), xv, dvalues.shape()[axis],
                             x_shape);
    }
  });
  return dx;
}

}  // namespace shardwise::ops
