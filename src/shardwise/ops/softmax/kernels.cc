#include "shardwise/ops/softmax/kernels.h"

#include "shardwise/tensor/fast_math.h"
#include "shardwise/tensor/parallel.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <limits>
#include <variant>
#include <vector>

namespace shardwise::ops {

namespace {

template <class T>
double to_f64(T v) {
  return static_cast<double>(static_cast<compute_t<T>>(v));
}
template <class T>
T from_f64(double v) {
  return static_cast<T>(static_cast<compute_t<T>>(v));
}

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

// x viewed as [outer, n, inner] around `axis`: element (o, j, i) sits at (o * n + j) * inner + i.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};

AxisView view_around(const Shape& shape, int axis) {
  AxisView v;
  for (int d = 0; d < shape.ndim(); ++d) {
    if (d < axis) v.outer *= shape[d];
    if (d == axis) v.n = shape[d];
    if (d > axis) v.inner *= shape[d];
  }
  return v;
}

// Calls fn(base, stride, scratch) for every slice along the axis: its elements are base + j * stride;
// `scratch` holds v.n doubles of the calling thread's own. The slices are split over the rank's
// threads (each slice is computed by one thread, as on one: the same bits).
template <class Fn>
void for_each_slice(const AxisView& v, Fn&& fn) {
  parallel_for(v.outer * v.inner, kParallelGrain / std::max<int64_t>(v.n, 1) + 1, [&](int64_t s0, int64_t s1) {
    std::vector<double> scratch(static_cast<size_t>(v.n));
    for (int64_t s = s0; s < s1; ++s) fn((s / v.inner) * v.n * v.inner + s % v.inner, v.inner, scratch.data());
  });
}

int checked_axis(int64_t axis, int ndim, std::string_view op) {
  SW_CHECK(ndim >= 1, "{}: x must have at least one dim, got a scalar", op);
  SW_CHECK(axis >= -ndim && axis < ndim, "{}: axis {} is out of range for x of rank {} (allowed {}..{})", op, axis,
           ndim, -ndim, ndim - 1);
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

// Reductions over a contiguous float row in kLanes interleaved partial results (lane l takes
// elements l, l + kLanes, ...; the lanes combine in a fixed tree): vectorizable, and a function of
// the row alone, so every rank that holds the row gets the same bits.
constexpr int64_t kLanes = 8;

SW_SIMD_CLONES float row_max(const float* x, int64_t n) {
  float m[kLanes];
  for (float& v : m) v = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  }
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  for (int64_t w = kLanes / 2; w > 0; w /= 2) {
    for (int64_t l = 0; l < w; ++l) m[l] = m[l + w] > m[l] ? m[l + w] : m[l];
  }
  return m[0];
}

// Whether the row holds a NaN.
SW_SIMD_CLONES bool row_has_nan(const float* x, int64_t n) {
  int32_t bad[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) bad[l] |= x[j + l] != x[j + l] ? 1 : 0;
  }
  for (; j < n; ++j) bad[0] |= x[j] != x[j] ? 1 : 0;
  int32_t any = 0;
  for (int32_t b : bad) any |= b;
  return any != 0;
}

double lane_total(const double* acc) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// exp(d) for d = x - max <= 0, in float: fast_expf (~3 ulp), and 0 below e^-80. What is flushed
// is below 2e-35 of the row's sum (which is >= 1): dropping it changes nothing a float can hold,
// and it keeps subnormals (slow on x86, and fast_expf would clamp at e^-87 rather than reach 0)
// out of the probabilities: a causal mask's -1e9 gives exactly 0, as std::exp does.
inline float exp_shifted(float d) { return d < -80.0f ? 0.0f : fast_expf(d); }

// sum_j exp_shifted(x[j] - mx), accumulated in double; e (when not null) receives the exponentials.
SW_SIMD_CLONES double row_sum_exp(const float* x, float mx, float* e, int64_t n) {
  double acc[kLanes] = {};
  int64_t j = 0;
  if (e) {
    for (; j + kLanes <= n; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float v = exp_shifted(x[j + l] - mx);
        e[j + l] = v;
        acc[l] += static_cast<double>(v);
      }
    }
  } else {
    for (; j + kLanes <= n; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(exp_shifted(x[j + l] - mx));
    }
  }
  for (; j < n; ++j) {
    const float v = exp_shifted(x[j] - mx);
    if (e) e[j] = v;
    acc[0] += static_cast<double>(v);
  }
  return lane_total(acc);
}

// sum_j a[j] * b[j] in double.
SW_SIMD_CLONES double row_dot(const float* a, const float* b, int64_t n) {
  double acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(a[j + l]) * static_cast<double>(b[j + l]);
  }
  for (; j < n; ++j) acc[0] += static_cast<double>(a[j]) * static_cast<double>(b[j]);
  return lane_total(acc);
}

// f32 softmax / log_softmax of one contiguous row whose max `mx` is finite and that holds no NaN:
// exponentials in float (exp_shifted), the sum in double, then one multiplication by 1 / sum.
SW_SIMD_CLONES void softmax_row_f32(const float* x, float* y, int64_t n, float mx, bool log) {
  if (log) {
    const auto log_sum = static_cast<float>(std::log(row_sum_exp(x, mx, nullptr, n)));
    for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mx) - log_sum;
    return;
  }
  const double sum = row_sum_exp(x, mx, y, n);
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
}

// Whether a row of cross-entropy logits takes the f32 path: f32, a finite max (the global one
// under vocab parallelism: every local element is <= it) and no NaN in the row.
template <class T>
bool fast_f32_row(const T* row, int64_t n, double mx) {
  if constexpr (std::is_same_v<T, float>) {
    return std::isfinite(mx) && !row_has_nan(row, n);
  } else {
    return false;
  }
}
bool fast_f32_row(const float* row, int64_t n, double mx) { return fast_f32_row<float>(row, n, mx); }

// softmax (log = false) or log_softmax (log = true) of every slice.
Tensor softmax_impl(const Tensor& x, int axis, bool log) {
  std::string_view op = log ? "log_softmax" : "softmax";
  SW_CHECK(x.defined(), "{}: x is undefined", op);
  axis = checked_axis(axis, x.ndim(), op);
  Tensor out = Tensor::uninitialized(x.dtype(), x.shape());
  AxisView v = view_around(x.shape(), axis);
  dispatch_float(x.dtype(), op, [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for_each_slice(v, [&](int64_t base, int64_t stride, double* e) {
      if constexpr (std::is_same_v<T, float>) {
        if (stride == 1) {
          const float mx = row_max(px + base, v.n);
          if (std::isfinite(mx) && !row_has_nan(px + base, v.n)) {
            softmax_row_f32(px + base, po + base, v.n, mx, log);
            return;
          }
        }
      }
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < v.n; ++j) mx = std::max(mx, to_f64(px[base + j * stride]));
      double sum = 0;
      for (int64_t j = 0; j < v.n; ++j) {
        e[j] = std::exp(to_f64(px[base + j * stride]) - mx);
        sum += e[j];
      }
      double log_sum = std::log(sum);
      for (int64_t j = 0; j < v.n; ++j) {
        double r = log ? to_f64(px[base + j * stride]) - mx - log_sum : e[j] / sum;
        po[base + j * stride] = from_f64<T>(r);
      }
    });
  });
  return out;
}

Tensor softmax_backward_impl(const Tensor& out, const Tensor& dout, int axis, bool log) {
  std::string_view op = log ? "log_softmax backward" : "softmax backward";
  SW_CHECK(out.defined() && dout.defined(), "{}: out or dout is undefined", op);
  SW_CHECK(out.shape() == dout.shape() && out.dtype() == dout.dtype(),
           "{}: dout ({} {}) must have out's shape and dtype ({} {})", op, dtype_name(dout.dtype()),
           dout.shape().to_string(), dtype_name(out.dtype()), out.shape().to_string());
  axis = checked_axis(axis, out.ndim(), op);
  Tensor dx = Tensor::uninitialized(out.dtype(), out.shape());
  AxisView v = view_around(out.shape(), axis);
  dispatch_float(out.dtype(), op, [&]<class T>() {
    const T* py = out.data<T>();
    const T* pg = dout.data<T>();
    T* pdx = dx.data<T>();
    for_each_slice(v, [&](int64_t base, int64_t stride, double*) {
      if constexpr (std::is_same_v<T, float>) {
        if (stride == 1 && !log) {
          // The sum in double lanes; each element as below, in double, rounded once.
          const double s = row_dot(pg + base, py + base, v.n);
          for (int64_t j = 0; j < v.n; ++j) {
            const auto y = static_cast<double>(py[base + j]), g = static_cast<double>(pg[base + j]);
            pdx[base + j] = static_cast<float>(y * (g - s));
          }
          return;
        }
      }
      double s = 0;
      for (int64_t j = 0; j < v.n; ++j) {
        int64_t at = base + j * stride;
        s += log ? to_f64(pg[at]) : to_f64(pg[at]) * to_f64(py[at]);
      }
      for (int64_t j = 0; j < v.n; ++j) {
        int64_t at = base + j * stride;
        double y = to_f64(py[at]), g = to_f64(pg[at]);
        pdx[at] = from_f64<T>(log ? g - std::exp(y) * s : y * (g - s));
      }
    });
  });
  return dx;
}

// labels as int64 (i64 or i32 input).
std::vector<int64_t> read_labels(const Tensor& labels) {
  std::vector<int64_t> out(static_cast<size_t>(labels.numel()));
  if (labels.dtype() == DType::I64) {
    const int64_t* p = labels.data<int64_t>();
    out.assign(p, p + labels.numel());
  } else {
    const int32_t* p = labels.data<int32_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

// Validated labels and the number of non-ignored ones.
struct LabelRows {
  std::vector<int64_t> labels;
  int64_t count = 0;
};

LabelRows check_labels(const Tensor& labels, int64_t classes, int64_t ignore_index) {
  LabelRows r{read_labels(labels), 0};
  for (size_t i = 0; i < r.labels.size(); ++i) {
    int64_t y = r.labels[i];
    if (y == ignore_index) continue;
    SW_CHECK(y >= 0 && y < classes,
             "cross_entropy: label {} at position {} is out of range: labels must be in [0, {}) or equal "
             "ignore_index ({})",
             y, i, classes, ignore_index);
    ++r.count;
  }
  return r;
}

void check_inputs_defined(const Tensor& logits, const Tensor& labels) {
  SW_CHECK(logits.defined() && labels.defined(), "cross_entropy: logits or labels is undefined");
  check_cross_entropy_args(logits.shape(), logits.dtype(), labels.shape(), labels.dtype());
}

}  // namespace

int softmax_axis(const Attrs& attrs, int ndim, std::string_view op) {
  return checked_axis(attrs.get_int("axis", -1), ndim, op);
}

Tensor softmax(const Tensor& x, int axis) { return softmax_impl(x, axis, false); }
Tensor log_softmax(const Tensor& x, int axis) { return softmax_impl(x, axis, true); }
Tensor softmax_backward(const Tensor& out, const Tensor& dout, int axis) {
  return softmax_backward_impl(out, dout, axis, false);
}
Tensor log_softmax_backward(const Tensor& out, const Tensor& dout, int axis) {
  return softmax_backward_impl(out, dout, axis, true);
}

LossReduction loss_reduction(const Attrs& attrs, std::string_view op) {
  const AttrValue* v = attrs.find("reduction");
  if (v == nullptr) return LossReduction::Mean;
  const auto* s = std::get_if<std::string>(v);
  if (s != nullptr) {
    if (*s == "mean") return LossReduction::Mean;
    if (*s == "sum") return LossReduction::Sum;
    if (*s == "none") return LossReduction::None;
  }
  fail("{}: attribute reduction must be \"mean\", \"sum\" or \"none\", got '{}'", op, attrs.to_string());
}

void check_cross_entropy_args(const Shape& logits, DType logits_dtype, const Shape& labels, DType labels_dtype) {
  SW_CHECK(is_floating(logits_dtype), "cross_entropy: logits must have a floating dtype (f32, f64, f16, bf16), got {}",
           dtype_name(logits_dtype));
  SW_CHECK(logits.ndim() >= 1, "cross_entropy: logits must have a class dim (shape [..., C]), got a scalar");
  SW_CHECK(labels_dtype == DType::I64 || labels_dtype == DType::I32,
           "cross_entropy: labels must be i64 or i32 class ids, got {}", dtype_name(labels_dtype));
  bool ok = labels.ndim() == logits.ndim() - 1;
  for (int d = 0; ok && d < labels.ndim(); ++d) ok = labels[d] == logits[d];
  SW_CHECK(ok, "cross_entropy: labels must have logits' shape without the class dim: logits {} needs labels of shape "
               "[{}], got {}",
           logits.to_string(), fmt::join(logits.span().first(static_cast<size_t>(logits.ndim() - 1)), ","),
           labels.to_string());
}

Shape cross_entropy_loss_shape(const Shape& labels, LossReduction reduction) {
  return reduction == LossReduction::None ? labels : Shape{};
}

namespace {

// Error unless the block [offset, offset + C_local) lies in [0, classes); returns the global count.
int64_t checked_classes(const Tensor& logits, const ClassShard& shard) {
  int64_t local = logits.shape().back();
  int64_t classes = shard.classes < 0 ? local : shard.classes;
  SW_CHECK(shard.offset >= 0 && shard.offset + local <= classes,
           "cross_entropy: the logits block holds classes [{}, {}), outside the {} classes", shard.offset,
           shard.offset + local, classes);
  return classes;
}

void check_rows(std::string_view what, std::span<const double> values, size_t rows) {
  SW_CHECK(values.size() == rows, "cross_entropy: {} has {} rows, labels {}", what, values.size(), rows);
}

}  // namespace

std::vector<double> cross_entropy_local_max(const Tensor& logits) {
  SW_CHECK(logits.defined() && logits.ndim() >= 1, "cross_entropy: logits must be defined with a class dim");
  const int64_t c_local = logits.shape().back();
  int64_t rows = 1;  // the leading extents (logits may hold no class, so not numel / C)
  for (int d = 0; d + 1 < logits.ndim(); ++d) rows *= logits.shape()[d];
  std::vector<double> mx(static_cast<size_t>(rows), -std::numeric_limits<double>::infinity());
  dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>() {
    const T* px = logits.data<T>();
    parallel_for(rows, kParallelGrain / std::max<int64_t>(c_local, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (auto i = static_cast<size_t>(r0); i < static_cast<size_t>(r1); ++i) {
        const T* row = px + static_cast<int64_t>(i) * c_local;
        if constexpr (std::is_same_v<T, float>) {
          // The same value (a max is exact; NaN is skipped in both), in float lanes.
          if (c_local > 0) mx[i] = static_cast<double>(row_max(row, c_local));
          continue;
        }
        for (int64_t c = 0; c < c_local; ++c) mx[i] = std::max(mx[i], to_f64(row[c]));
      }
    });
  });
  return mx;
}

CrossEntropyRowSums cross_entropy_local_sums(const Tensor& logits, const Tensor& labels,
                                             std::span<const double> row_max, int64_t ignore_index,
                                             const ClassShard& shard) {
  check_inputs_defined(logits, labels);
  const int64_t c_local = logits.shape().back();
  LabelRows rows = check_labels(labels, checked_classes(logits, shard), ignore_index);
  check_rows("the row max", row_max, rows.labels.size());
  CrossEntropyRowSums s{std::vector<double>(rows.labels.size(), 0.0), std::vector<double>(rows.labels.size(), 0.0)};
  dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>() {
    const T* px = logits.data<T>();
    const auto n_rows = static_cast<int64_t>(rows.labels.size());
    parallel_for(n_rows, kParallelGrain / std::max<int64_t>(c_local, 1) + 1, [&](int64_t r0, int64_t r1) {
    for (auto i = static_cast<size_t>(r0); i < static_cast<size_t>(r1); ++i) {
      const T* row = px + static_cast<int64_t>(i) * c_local;
      bool fast = false;
      if constexpr (std::is_same_v<T, float>) {
        fast = fast_f32_row(row, c_local, row_max[i]);
        if (fast) s.sum_exp[i] = row_sum_exp(row, static_cast<float>(row_max[i]), nullptr, c_local);
      }
      if (!fast) {
        for (int64_t c = 0; c < c_local; ++c) s.sum_exp[i] += std::exp(to_f64(row[c]) - row_max[i]);
      }
      int64_t local_label = rows.labels[i] - shard.offset;
      if (rows.labels[i] != ignore_index && local_label >= 0 && local_label < c_local) {
        s.target[i] = to_f64(row[local_label]);
      }
    }
    });
  });
  return s;
}

Tensor cross_entropy_from_rows(const Tensor& labels, DType dtype, std::span<const double> row_max,
                               const CrossEntropyRowSums& sums, int64_t ignore_index, LossReduction reduction) {
  std::vector<int64_t> ids = read_labels(labels);
  check_rows("the row max", row_max, ids.size());
  check_rows("the sum of exponentials", sums.sum_exp, ids.size());
  check_rows("the target logits", sums.target, ids.size());
  Tensor loss(dtype, cross_entropy_loss_shape(labels.shape(), reduction));
  dispatch_float(dtype, "cross_entropy", [&]<class T>() {
    T* pl = loss.data<T>();
    double total = 0;
    int64_t count = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      double li = 0;
      if (ids[i] != ignore_index) {
        li = row_max[i] + std::log(sums.sum_exp[i]) - sums.target[i];
        ++count;
      }
      if (reduction == LossReduction::None) pl[i] = from_f64<T>(li);
      total += li;
    }
    if (reduction == LossReduction::Sum) pl[0] = from_f64<T>(total);
    if (reduction == LossReduction::Mean) pl[0] = from_f64<T>(total / static_cast<double>(count));
  });
  return loss;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, LossReduction reduction) {
  check_inputs_defined(logits, labels);
  std::vector<double> mx = cross_entropy_local_max(logits);
  CrossEntropyRowSums sums = cross_entropy_local_sums(logits, labels, mx, ignore_index);
  return cross_entropy_from_rows(labels, logits.dtype(), mx, sums, ignore_index, reduction);
}

Tensor cross_entropy_backward_from_rows(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                                        std::span<const double> row_max, std::span<const double> sum_exp,
                                        int64_t ignore_index, LossReduction reduction, const ClassShard& shard) {
  check_inputs_defined(logits, labels);
  Shape want = cross_entropy_loss_shape(labels.shape(), reduction);
  SW_CHECK(dloss.defined() && dloss.shape() == want && dloss.dtype() == logits.dtype(),
           "cross_entropy backward: dloss must be {} {}, got {} {}", dtype_name(logits.dtype()), want.to_string(),
           dloss.defined() ? dtype_name(dloss.dtype()) : "undefined", dloss.shape().to_string());
  const int64_t c_local = logits.shape().back();
  LabelRows rows = check_labels(labels, checked_classes(logits, shard), ignore_index);
  check_rows("the row max", row_max, rows.labels.size());
  check_rows("the sum of exponentials", sum_exp, rows.labels.size());
  Tensor dx(logits.dtype(), logits.shape());
  dispatch_float(logits.dtype(), "cross_entropy backward", [&]<class T>() {
    const T* px = logits.data<T>();
    const T* pg = dloss.data<T>();
    T* pdx = dx.data<T>();
    const auto n_rows = static_cast<int64_t>(rows.labels.size());
    parallel_for(n_rows, kParallelGrain / std::max<int64_t>(c_local, 1) + 1, [&](int64_t r0, int64_t r1) {
    for (auto i = static_cast<size_t>(r0); i < static_cast<size_t>(r1); ++i) {
      if (rows.labels[i] == ignore_index) continue;  // dx stays 0
      const int64_t y = rows.labels[i] - shard.offset;
      double w = reduction == LossReduction::None ? to_f64(pg[i]) : to_f64(pg[0]);
      if (reduction == LossReduction::Mean) w /= static_cast<double>(rows.count);
      const T* row = px + static_cast<int64_t>(i) * c_local;
      T* drow = pdx + static_cast<int64_t>(i) * c_local;
      if (fast_f32_row<T>(row, c_local, row_max[i])) {
        // p = exp_shifted(x - max) / sum, then (p - [c == y]) * w in double as below.
        const auto mxf = static_cast<float>(row_max[i]);
        const double inv = 1.0 / sum_exp[i];
        for (int64_t c = 0; c < c_local; ++c) {
          const double p = static_cast<double>(exp_shifted(static_cast<float>(row[c]) - mxf)) * inv;
          drow[c] = static_cast<T>(p * w);
        }
        if (y >= 0 && y < c_local) {
          const double p = static_cast<double>(exp_shifted(static_cast<float>(row[y]) - mxf)) * inv;
          drow[y] = static_cast<T>((p - 1.0) * w);
        }
        continue;
      }
      for (int64_t c = 0; c < c_local; ++c) {
        double p = std::exp(to_f64(row[c]) - row_max[i]) / sum_exp[i];
        drow[c] = from_f64<T>((p - (c == y ? 1.0 : 0.0)) * w);
      }
    }
    });
  });
  return dx;
}

CrossEntropyRowSums cross_entropy_local_sums_to_exp(Tensor& logits, const Tensor& labels,
                                                    std::span<const double> row_max, int64_t ignore_index,
                                                    const ClassShard& shard, std::vector<uint8_t>& exp_rows) {
  check_inputs_defined(logits, labels);
  const int64_t c_local = logits.shape().back();
  LabelRows rows = check_labels(labels, checked_classes(logits, shard), ignore_index);
  check_rows("the row max", row_max, rows.labels.size());
  const size_t n = rows.labels.size();
  CrossEntropyRowSums s{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  exp_rows.assign(n, 0);
  dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>() {
    T* px = logits.data<T>();
    parallel_for(static_cast<int64_t>(n), kParallelGrain / std::max<int64_t>(c_local, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (auto i = static_cast<size_t>(r0); i < static_cast<size_t>(r1); ++i) {
        T* row = px + static_cast<int64_t>(i) * c_local;
        const int64_t local_label = rows.labels[i] - shard.offset;
        if (rows.labels[i] != ignore_index && local_label >= 0 && local_label < c_local) {
          s.target[i] = to_f64(row[local_label]);  // before the row becomes exponentials
        }
        if constexpr (std::is_same_v<T, float>) {
          if (fast_f32_row(row, c_local, row_max[i])) {
            s.sum_exp[i] = row_sum_exp(row, static_cast<float>(row_max[i]), row, c_local);
            exp_rows[i] = 1;
            continue;
          }
        }
        for (int64_t c = 0; c < c_local; ++c) s.sum_exp[i] += std::exp(to_f64(row[c]) - row_max[i]);
      }
    });
  });
  return s;
}

void cross_entropy_grad_in_place(Tensor& x, const Tensor& labels, double w, std::span<const double> row_max,
                                 std::span<const double> sum_exp, std::span<const uint8_t> exp_rows,
                                 int64_t ignore_index, const ClassShard& shard) {
  check_inputs_defined(x, labels);
  const int64_t c_local = x.shape().back();
  LabelRows rows = check_labels(labels, checked_classes(x, shard), ignore_index);
  check_rows("the row max", row_max, rows.labels.size());
  check_rows("the sum of exponentials", sum_exp, rows.labels.size());
  SW_CHECK(exp_rows.size() == rows.labels.size(), "cross_entropy: {} exponential-row flags for {} rows",
           exp_rows.size(), rows.labels.size());
  dispatch_float(x.dtype(), "cross_entropy backward", [&]<class T>() {
    T* px = x.data<T>();
    const auto n_rows = static_cast<int64_t>(rows.labels.size());
    parallel_for(n_rows, kParallelGrain / std::max<int64_t>(c_local, 1) + 1, [&](int64_t r0, int64_t r1) {
      for (auto i = static_cast<size_t>(r0); i < static_cast<size_t>(r1); ++i) {
        T* row = px + static_cast<int64_t>(i) * c_local;
        if (rows.labels[i] == ignore_index) {
          std::fill(row, row + c_local, T(0));
          continue;
        }
        const int64_t y = rows.labels[i] - shard.offset;
        if (exp_rows[i]) {  // row[c] = exp_shifted(logit - max): as cross_entropy_backward_from_rows' f32 path
          const double inv = 1.0 / sum_exp[i];
          const double py = y >= 0 && y < c_local ? static_cast<double>(row[y]) * inv : 0.0;
          for (int64_t c = 0; c < c_local; ++c) row[c] = static_cast<T>(static_cast<double>(row[c]) * inv * w);
          if (y >= 0 && y < c_local) row[y] = static_cast<T>((py - 1.0) * w);
          continue;
        }
        for (int64_t c = 0; c < c_local; ++c) {
          const double p = std::exp(to_f64(row[c]) - row_max[i]) / sum_exp[i];
          row[c] = from_f64<T>((p - (c == y ? 1.0 : 0.0)) * w);
        }
      }
    });
  });
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss, int64_t ignore_index,
                              LossReduction reduction) {
  check_inputs_defined(logits, labels);
  std::vector<double> mx = cross_entropy_local_max(logits);
  CrossEntropyRowSums sums = cross_entropy_local_sums(logits, labels, mx, ignore_index);
  return cross_entropy_backward_from_rows(logits, labels, dloss, mx, sums.sum_exp, ignore_index, reduction);
}

}  // namespace shardwise::ops
