#include "shardwise/ops/reduction/kernels.h"

#include <cmath>
#include <limits>
#include <variant>
#include <vector>

namespace shardwise::ops {

std::string_view reduce_kind_name(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum: return "sum";
    case ReduceKind::Mean: return "mean";
    case ReduceKind::Max: return "max";
    case ReduceKind::Min: return "min";
    case ReduceKind::AMax: return "amax";
    case ReduceKind::AMin: return "amin";
    case ReduceKind::Prod: return "prod";
  }
  return "?";
}

uint32_t reduce_axes_mask(const Attrs& attrs, int ndim, std::string_view op) {
  uint32_t all = ndim >= 32 ? ~0u : ((1u << ndim) - 1u);
  const AttrValue* value = attrs.find("axis");
  if (value == nullptr) return all;
  auto add = [&](uint32_t& mask, int64_t axis) {
    SW_CHECK(axis >= -ndim && axis < ndim, "{}: axis {} is out of range for a tensor of rank {} (allowed {}..{})", op,
             axis, ndim, -ndim, ndim - 1);
    int d = static_cast<int>(axis < 0 ? axis + ndim : axis);
    SW_CHECK(!(mask & (1u << d)), "{}: axis {} is listed twice (dim {} of a rank-{} tensor); list each axis once", op,
             axis, d, ndim);
    mask |= 1u << d;
  };
  uint32_t mask = 0;
  if (const auto* list = std::get_if<std::vector<int64_t>>(value)) {
    if (list->empty()) return all;
    for (int64_t axis : *list) add(mask, axis);
  } else if (const auto* one = std::get_if<int64_t>(value)) {
    add(mask, *one);
  } else {
    fail("{}: attribute 'axis' must be an int or an int list, got {}", op, attrs.to_string());
  }
  return mask;
}

Shape reduce_output_shape(const Shape& input, uint32_t mask, bool keepdim) {
  Shape out;
  for (int d = 0; d < input.ndim(); ++d) {
    if (!(mask & (1u << d))) {
      out.push_back(input[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

void check_reduce_dtype(ReduceKind kind, DType dtype) {
  SW_CHECK(dtype != DType::Bool, "{}: bool tensors are not supported; convert to an integer dtype first",
           reduce_kind_name(kind));
  SW_CHECK(kind != ReduceKind::Mean || is_floating(dtype),
           "mean: needs a floating dtype (f32, f64, f16, bf16), got {}; use sum for integers", dtype_name(dtype));
}

namespace {

// Row-major offsets (in elements of x) of every index over the dims selected by `mask`
// (`reduced` = true) or by its complement. Slice base offsets use the kept dims, in output order;
// positions within a slice use the reduced dims.
std::vector<int64_t> offsets_over(const Shape& shape, uint32_t mask, bool reduced) {
  std::array<int64_t, kMaxDims> strides = contiguous_strides(shape);
  std::array<int, kMaxDims> dims{};
  int nd = 0;
  int64_t count = 1;
  for (int d = 0; d < shape.ndim(); ++d) {
    if (static_cast<bool>(mask & (1u << d)) == reduced) {
      dims[static_cast<size_t>(nd++)] = d;
      count *= shape[d];
    }
  }
  std::vector<int64_t> out(static_cast<size_t>(count));
  std::array<int64_t, kMaxDims> idx{};
  int64_t off = 0;
  for (int64_t i = 0; i < count; ++i) {
    out[static_cast<size_t>(i)] = off;
    for (int k = nd - 1; k >= 0; --k) {
      auto d = static_cast<size_t>(dims[static_cast<size_t>(k)]);
      off += strides[d];
      if (++idx[static_cast<size_t>(k)] < shape[static_cast<int>(d)]) break;
      off -= strides[d] * shape[static_cast<int>(d)];
      idx[static_cast<size_t>(k)] = 0;
    }
  }
  return out;
}

template <class T>
constexpr bool kIsFloat = is_float_v<T>;

// Integers accumulate in uint64 (wrapping, well defined) and convert back through int64.
template <class T>
uint64_t to_u64(T v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}
template <class T>
T from_u64(uint64_t v) {
  return static_cast<T>(static_cast<int64_t>(v));
}
template <class T>
double to_f64(T v) {
  return static_cast<double>(static_cast<compute_t<T>>(v));
}
template <class T>
T from_f64(double v) {
  return static_cast<T>(static_cast<compute_t<T>>(v));
}

bool is_max_kind(ReduceKind k) { return k == ReduceKind::Max || k == ReduceKind::AMax; }
bool is_extremum_kind(ReduceKind k) {
  return k == ReduceKind::Max || k == ReduceKind::AMax || k == ReduceKind::Min || k == ReduceKind::AMin;
}

template <class T>
void reduce_typed(ReduceKind kind, const T* x, T* y, const std::vector<int64_t>& bases,
                  const std::vector<int64_t>& offs) {
  using C = compute_t<T>;
  const auto n = static_cast<int64_t>(offs.size());
  for (size_t o = 0; o < bases.size(); ++o) {
    const T* s = x + bases[o];
    if (kind == ReduceKind::Sum || kind == ReduceKind::Mean || kind == ReduceKind::Prod) {
      bool prod = kind == ReduceKind::Prod;
      if constexpr (kIsFloat<T>) {
        double acc = prod ? 1.0 : 0.0;
        for (int64_t r : offs) acc = prod ? acc * to_f64(s[r]) : acc + to_f64(s[r]);
        if (kind == ReduceKind::Mean) acc /= static_cast<double>(n);  // 0 / 0 = NaN for an empty extent
        y[o] = from_f64<T>(acc);
      } else {
        uint64_t acc = prod ? 1 : 0;
        for (int64_t r : offs) acc = prod ? acc * to_u64(s[r]) : acc + to_u64(s[r]);
        y[o] = from_u64<T>(acc);
      }
    } else {
      bool want_max = is_max_kind(kind);
      C acc;
      if constexpr (kIsFloat<T>) {
        acc = want_max ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
      } else {
        acc = want_max ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
      }
      for (int64_t r : offs) {
        C v = static_cast<C>(s[r]);
        // NaN wins and stays (a NaN accumulator compares false forever).
        bool nan = false;
        if constexpr (kIsFloat<T>) nan = std::isnan(v);
        if ((want_max ? v > acc : v < acc) || nan) acc = v;
      }
      y[o] = static_cast<T>(acc);
    }
  }
}

template <class T>
void backward_typed(ReduceKind kind, const T* x, const T* out, const T* dout, T* dx,
                    const std::vector<int64_t>& bases, const std::vector<int64_t>& offs) {
  using C = compute_t<T>;
  const auto n = static_cast<int64_t>(offs.size());
  std::vector<double> pre_f, suf_f;
  std::vector<uint64_t> pre_i, suf_i;
  for (size_t o = 0; o < bases.size(); ++o) {
    const T* s = x + bases[o];
    T* g = dx + bases[o];
    switch (kind) {
      case ReduceKind::Sum:
        for (int64_t r : offs) g[r] = dout[o];
        break;
      case ReduceKind::Mean:
        if constexpr (kIsFloat<T>) {
          T v = from_f64<T>(to_f64(dout[o]) / static_cast<double>(n));
          for (int64_t r : offs) g[r] = v;
        }
        break;
      case ReduceKind::Max:
      case ReduceKind::Min: {
        // Every position equal to the extremum receives the full output gradient.
        C m = static_cast<C>(out[o]);
        for (int64_t r : offs) g[r] = static_cast<C>(s[r]) == m ? dout[o] : T{};
        break;
      }
      case ReduceKind::AMax:
      case ReduceKind::AMin: {
        // The output gradient is shared evenly among the tied positions.
        C m = static_cast<C>(out[o]);
        int64_t count = 0;
        for (int64_t r : offs) count += static_cast<C>(s[r]) == m ? 1 : 0;
        T share{};
        if (count > 0) {
          if constexpr (kIsFloat<T>) {
            share = from_f64<T>(to_f64(dout[o]) / static_cast<double>(count));
          } else {
            share = static_cast<T>(static_cast<int64_t>(dout[o]) / count);
          }
        }
        for (int64_t r : offs) g[r] = static_cast<C>(s[r]) == m ? share : T{};
        break;
      }
      case ReduceKind::Prod: {
        // dx_i = dout * prod_{j<i} x_j * prod_{j>i} x_j: exact with zeros.
        auto un = static_cast<size_t>(n);
        if constexpr (kIsFloat<T>) {
          pre_f.assign(un + 1, 1.0);
          suf_f.assign(un + 1, 1.0);
          for (size_t i = 0; i < un; ++i) pre_f[i + 1] = pre_f[i] * to_f64(s[offs[i]]);
          for (size_t i = un; i-- > 0;) suf_f[i] = suf_f[i + 1] * to_f64(s[offs[i]]);
          double d = to_f64(dout[o]);
          for (size_t i = 0; i < un; ++i) g[offs[i]] = from_f64<T>(d * (pre_f[i] * suf_f[i + 1]));
        } else {
          pre_i.assign(un + 1, 1);
          suf_i.assign(un + 1, 1);
          for (size_t i = 0; i < un; ++i) pre_i[i + 1] = pre_i[i] * to_u64(s[offs[i]]);
          for (size_t i = un; i-- > 0;) suf_i[i] = suf_i[i + 1] * to_u64(s[offs[i]]);
          uint64_t d = to_u64(dout[o]);
          for (size_t i = 0; i < un; ++i) g[offs[i]] = from_u64<T>(d * (pre_i[i] * suf_i[i + 1]));
        }
        break;
      }
    }
  }
}

}  // namespace

Tensor reduce(ReduceKind kind, const Tensor& x, uint32_t mask, bool keepdim) {
  SW_CHECK(x.defined(), "{}: the input tensor is undefined", reduce_kind_name(kind));
  check_reduce_dtype(kind, x.dtype());
  Tensor y(x.dtype(), reduce_output_shape(x.shape(), mask, keepdim));
  std::vector<int64_t> bases = offsets_over(x.shape(), mask, false);
  std::vector<int64_t> offs = offsets_over(x.shape(), mask, true);
  SW_DISPATCH(x.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) reduce_typed<T>(kind, x.data<T>(), y.data<T>(), bases, offs);
  });
  return y;
}

Tensor reduce(ReduceKind kind, const Tensor& x, const Attrs& attrs) {
  SW_CHECK(x.defined(), "{}: the input tensor is undefined", reduce_kind_name(kind));
  return reduce(kind, x, reduce_axes_mask(attrs, x.ndim(), reduce_kind_name(kind)), reduce_keepdim(attrs));
}

Tensor reduce_backward(ReduceKind kind, const Tensor& x, const Tensor& out, const Tensor& dout, uint32_t mask,
                       bool keepdim) {
  std::string_view name = reduce_kind_name(kind);
  SW_CHECK(x.defined() && dout.defined(), "{} backward: x and dout must be defined", name);
  check_reduce_dtype(kind, x.dtype());
  Shape out_shape = reduce_output_shape(x.shape(), mask, keepdim);
  SW_CHECK(dout.dtype() == x.dtype() && dout.shape() == out_shape,
           "{} backward: dout must be {} {} (the output of x {} {}), got {} {}", name, dtype_name(x.dtype()),
           out_shape.to_string(), dtype_name(x.dtype()), x.shape().to_string(), dtype_name(dout.dtype()),
           dout.shape().to_string());
  bool reads_out = is_extremum_kind(kind);
  SW_CHECK(!reads_out || (out.defined() && out.dtype() == x.dtype() && out.shape() == out_shape),
           "{} backward: out must be the forward output, {} {}, got {} {}", name, dtype_name(x.dtype()),
           out_shape.to_string(), out.defined() ? dtype_name(out.dtype()) : "undefined",
           out.defined() ? out.shape().to_string() : "");
  Tensor dx(x.dtype(), x.shape());
  std::vector<int64_t> bases = offsets_over(x.shape(), mask, false);
  std::vector<int64_t> offs = offsets_over(x.shape(), mask, true);
  SW_DISPATCH(x.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      backward_typed<T>(kind, x.data<T>(), reads_out ? out.data<T>() : nullptr, dout.data<T>(), dx.data<T>(), bases,
                        offs);
    }
  });
  return dx;
}

Tensor reduce_backward(ReduceKind kind, const Tensor& x, const Tensor& out, const Tensor& dout, const Attrs& attrs) {
  SW_CHECK(x.defined(), "{} backward: the input tensor is undefined", reduce_kind_name(kind));
  return reduce_backward(kind, x, out, dout, reduce_axes_mask(attrs, x.ndim(), reduce_kind_name(kind)),
                         reduce_keepdim(attrs));
}

}  // namespace shardwise::ops
