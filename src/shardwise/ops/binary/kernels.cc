#include "shardwise/ops/binary/kernels.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "shardwise/core/error.h"
#include "shardwise/tensor/broadcast.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

std::string_view binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Subtract: return "subtract";
    case BinaryOp::Multiply: return "multiply";
    case BinaryOp::Divide: return "divide";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::Fmax: return "fmax";
    case BinaryOp::Fmin: return "fmin";
    case BinaryOp::Atan2: return "atan2";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::BitwiseAnd: return "bitwise_and";
    case BinaryOp::BitwiseOr: return "bitwise_or";
    case BinaryOp::BitwiseXor: return "bitwise_xor";
  }
  fail("unknown binary op code {}", static_cast<int>(op));
}

namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? fmt::format("{} {}", dtype_name(t.dtype()), t.shape().to_string()) : "undefined";
}

bool is_bitwise(BinaryOp op) {
  return op == BinaryOp::BitwiseAnd || op == BinaryOp::BitwiseOr || op == BinaryOp::BitwiseXor;
}
bool is_float_only(BinaryOp op) {
  return op == BinaryOp::Divide || op == BinaryOp::Atan2 || op == BinaryOp::Pow;
}

std::string_view allowed_dtypes(BinaryOp op) {
  if (is_bitwise(op)) return "integer dtypes and bool";
  if (is_float_only(op)) return "floating dtypes (f32, f64, f16, bf16)";
  return "floating and integer dtypes (not bool)";
}

template <class C>
bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

// Integer add/subtract/multiply in the unsigned type: wraps like two's complement instead of UB.
template <class C, class F>
C wrapping(C a, C b, F f) {
  if constexpr (std::is_integral_v<C> && !std::is_same_v<C, bool>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(f(static_cast<U>(a), static_cast<U>(b))));
  } else {
    return f(a, b);
  }
}

// op(a, b) in the compute type C of the storage type. Only instantiated for supported dtypes.
template <class C>
C apply(BinaryOp op, C a, C b) {
  if constexpr (std::is_same_v<C, bool>) {
    switch (op) {
      case BinaryOp::BitwiseAnd: return a && b;
      case BinaryOp::BitwiseOr: return a || b;
      case BinaryOp::BitwiseXor: return a != b;
      default: break;
    }
  } else {
    switch (op) {
      case BinaryOp::Add: return wrapping(a, b, [](auto u, auto v) { return u + v; });
      case BinaryOp::Subtract: return wrapping(a, b, [](auto u, auto v) { return u - v; });
      case BinaryOp::Multiply: return wrapping(a, b, [](auto u, auto v) { return u * v; });
      case BinaryOp::Maximum:
        if (is_nan(a)) return a;
        if (is_nan(b)) return b;
        return a < b ? b : a;
      case BinaryOp::Minimum:
        if (is_nan(a)) return a;
        if (is_nan(b)) return b;
        return b < a ? b : a;
      case BinaryOp::Fmax:
        if (is_nan(b)) return a;
        if (is_nan(a)) return b;
        return a < b ? b : a;
      case BinaryOp::Fmin:
        if (is_nan(b)) return a;
        if (is_nan(a)) return b;
        return b < a ? b : a;
      default: break;
    }
    if constexpr (std::is_floating_point_v<C>) {
      switch (op) {
        case BinaryOp::Divide: return a / b;
        case BinaryOp::Atan2: return std::atan2(a, b);
        case BinaryOp::Pow: return std::pow(a, b);
        default: break;
      }
    } else {
      switch (op) {
        case BinaryOp::BitwiseAnd: return a & b;
        case BinaryOp::BitwiseOr: return a | b;
        case BinaryOp::BitwiseXor: return a ^ b;
        default: break;
      }
    }
  }
  fail("binary op {} is not defined for this dtype", binary_op_name(op));
}

// out = f(x, y) for the float arithmetic ops, row by row: a contiguous loop (vectorized) where
// both operands walk the row, a scalar operand where one repeats an element. Each element is the
// same f(a, b) as in the generic walk.
template <class T, class F>
void float_binary_rows(const Shape& shape, const Tensor& x, const Tensor& y, Tensor& out, F f) {
  using C = compute_t<T>;
  const T* px = x.data<T>();
  const T* py = y.data<T>();
  T* po = out.data<T>();
  if (x.shape() == shape && y.shape() == shape) {
    parallel_for(out.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = static_cast<T>(f(static_cast<C>(px[i]), static_cast<C>(py[i])));
    });
    return;
  }
  const int64_t inner = shape.ndim() == 0 ? 1 : std::max<int64_t>(1, shape[shape.ndim() - 1]);
  parallel_for(out.numel() / inner, kParallelGrain / inner + 1, [&](int64_t r0, int64_t r1) {
  broadcast_for_each_row<2>(shape, {x.shape(), y.shape()},
                            [&](int64_t i, int64_t len, const std::array<int64_t, 2>& o, const std::array<int64_t, 2>& st) {
    const T* a = px + o[0];
    const T* b = py + o[1];
    T* c = po + i;
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t j = 0; j < len; ++j) c[j] = static_cast<T>(f(static_cast<C>(a[j]), static_cast<C>(b[j])));
    } else if (st[0] == 1) {
      const C bv = static_cast<C>(b[0]);
      for (int64_t j = 0; j < len; ++j) c[j] = static_cast<T>(f(static_cast<C>(a[j]), bv));
    } else if (st[1] == 1) {
      const C av = static_cast<C>(a[0]);
      for (int64_t j = 0; j < len; ++j) c[j] = static_cast<T>(f(av, static_cast<C>(b[j])));
    } else {
      const T v = static_cast<T>(f(static_cast<C>(a[0]), static_cast<C>(b[0])));
      for (int64_t j = 0; j < len; ++j) c[j] = v;
    }
  }, r0, r1);
  });
}

// The float arithmetic ops through float_binary_rows; false for the others.
template <class T>
bool float_arithmetic(BinaryOp op, const Shape& shape, const Tensor& x, const Tensor& y, Tensor& out) {
  if constexpr (!is_float_v<T>) {
    return false;
  } else {
    using C = compute_t<T>;
    switch (op) {
      case BinaryOp::Add: float_binary_rows<T>(shape, x, y, out, [](C a, C b) { return a + b; }); return true;
      case BinaryOp::Subtract: float_binary_rows<T>(shape, x, y, out, [](C a, C b) { return a - b; }); return true;
      case BinaryOp::Multiply: float_binary_rows<T>(shape, x, y, out, [](C a, C b) { return a * b; }); return true;
      case BinaryOp::Divide: float_binary_rows<T>(shape, x, y, out, [](C a, C b) { return a / b; }); return true;
      default: return false;
    }
  }
}

}  // namespace

bool binary_op_has_gradient(BinaryOp op) { return !is_bitwise(op); }

bool binary_op_supports(BinaryOp op, DType dtype) {
  if (is_bitwise(op)) return is_integral(dtype) || dtype == DType::Bool;
  if (is_float_only(op)) return is_floating(dtype);
  return dtype != DType::Bool;
}

DType binary_result_dtype(BinaryOp op, DType x, DType y) {
  SW_CHECK(x == y, "{}: the inputs must share a dtype, got x: {} and y: {} (convert one first)",
           binary_op_name(op), dtype_name(x), dtype_name(y));
  SW_CHECK(binary_op_supports(op, x), "{} does not support dtype {}; allowed: {}", binary_op_name(op),
           dtype_name(x), allowed_dtypes(op));
  return x;
}

DType where_result_dtype(DType cond, DType x, DType y) {
  SW_CHECK(cond == DType::Bool, "where: the condition must be bool, got {}", dtype_name(cond));
  SW_CHECK(x == y, "where: x and y must share a dtype, got x: {} and y: {}", dtype_name(x), dtype_name(y));
  return x;
}

Tensor binary(BinaryOp op, const Tensor& x, const Tensor& y) {
  SW_CHECK(x.defined() && y.defined(), "{}: an input is undefined", binary_op_name(op));
  DType dtype = binary_result_dtype(op, x.dtype(), y.dtype());
  Shape shape = broadcast_shapes(x.shape(), y.shape());
  Tensor out = Tensor::uninitialized(dtype, shape);
  SW_DISPATCH(dtype, [&] {
    if (float_arithmetic<T>(op, shape, x, y, out)) return;
    using C = compute_t<T>;
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    T* po = out.data<T>();
    broadcast_for_each<2>(shape, {x.shape(), y.shape()}, [&](int64_t i, const std::array<int64_t, 2>& o) {
      po[i] = static_cast<T>(apply<C>(op, static_cast<C>(px[o[0]]), static_cast<C>(py[o[1]])));
    });
  });
  return out;
}

namespace {

// Share of the gradient that goes to x for max/min-like ops (y takes 1 - w): 1 when the op selected
// x, 0 when it selected y, 1/2 on a tie (half/half, PyTorch's convention for maximum/minimum).
template <class C>
C selection_weight(BinaryOp op, C a, C b) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  switch (op) {
    case BinaryOp::Maximum:
    case BinaryOp::Minimum:
      // NaN propagates: the NaN operand (x first) is the result and takes the gradient.
      if (na) return C(1);
      if (nb) return C(0);
      break;
    case BinaryOp::Fmax:
    case BinaryOp::Fmin:
      // NaN is ignored: the other operand is the result (x when both are NaN).
      if (nb) return C(1);
      if (na) return C(0);
      break;
    default: break;
  }
  const bool is_max = op == BinaryOp::Maximum || op == BinaryOp::Fmax;
  if (a == b) return C(0.5);  // tie: half/half, as PyTorch
  return (is_max ? a > b : a < b) ? C(1) : C(0);
}

// Full-shape (unreduced) gradients of x and y for floating T.
template <class T>
void binary_grad_kernel(BinaryOp op, const Tensor& x, const Tensor& y, const Tensor& dout, Tensor& gx, Tensor& gy) {
  if constexpr (is_float_v<T>) {
    const Shape& shape = dout.shape();
    using C = compute_t<T>;
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    const T* pg = dout.data<T>();
    T* gxp = gx.data<T>();
    T* gyp = gy.data<T>();
    auto kernel = [&](auto grads) {
      broadcast_for_each<2>(shape, {x.shape(), y.shape()}, [&](int64_t i, const std::array<int64_t, 2>& o) {
        auto [da, db] = grads(static_cast<C>(px[o[0]]), static_cast<C>(py[o[1]]), static_cast<C>(pg[i]));
        gxp[i] = static_cast<T>(da);
        gyp[i] = static_cast<T>(db);
      });
    };
    using P = std::pair<C, C>;
    switch (op) {
      case BinaryOp::Add: kernel([](C, C, C g) { return P{g, g}; }); break;
      case BinaryOp::Subtract: kernel([](C, C, C g) { return P{g, -g}; }); break;
      case BinaryOp::Multiply: kernel([](C a, C b, C g) { return P{g * b, g * a}; }); break;
      case BinaryOp::Divide: kernel([](C a, C b, C g) { return P{g / b, -(g / b) * (a / b)}; }); break;
      case BinaryOp::Maximum:
      case BinaryOp::Minimum:
      case BinaryOp::Fmax:
      case BinaryOp::Fmin:
        kernel([op](C a, C b, C g) {
          C w = selection_weight(op, a, b);
          return P{g * w, g * (C(1) - w)};
        });
        break;
      case BinaryOp::Atan2:
        kernel([](C a, C b, C g) {
          C d = a * a + b * b;
          return P{g * b / d, -g * a / d};
        });
        break;
      case BinaryOp::Pow:
        kernel([](C a, C b, C g) {
          C da = b == C(0) ? C(0) : g * b * std::pow(a, b - C(1));
          C db = (a == C(0) && b >= C(0)) ? C(0) : g * std::pow(a, b) * std::log(a);
          return P{da, db};
        });
        break;
      default: fail("{} has no gradient", binary_op_name(op));
    }
  }
}

}  // namespace

namespace {

// -g, for subtract's gradient of y (floats only; integers take no gradient).
template <class T>
void negate_into(const Tensor& g, Tensor& out) {
  if constexpr (is_float_v<T>) {
    const T* src = g.data<T>();
    T* dst = out.data<T>();
    for (int64_t i = 0; i < g.numel(); ++i) dst[i] = static_cast<T>(-static_cast<compute_t<T>>(src[i]));
  }
}

Tensor negated(const Tensor& g) {
  Tensor out = Tensor::uninitialized(g.dtype(), g.shape());
  SW_DISPATCH(g.dtype(), [&] { negate_into<T>(g, out); });
  return out;
}

}  // namespace

BinaryGrads binary_backward(BinaryOp op, const Tensor& x, const Tensor& y, const Tensor& out,
                            const Tensor& dout) {
  SW_CHECK(binary_op_has_gradient(op), "{} has no gradient", binary_op_name(op));
  DType dtype = binary_result_dtype(op, x.dtype(), y.dtype());
  Shape shape = broadcast_shapes(x.shape(), y.shape());
  SW_CHECK(dout.defined() && dout.shape() == shape && dout.dtype() == dtype,
           "{} backward: the output gradient must be {} {}, got {}", binary_op_name(op), dtype_name(dtype),
           shape.to_string(), describe(dout));
  if (!is_floating(dtype)) return {};
  if (op == BinaryOp::Add || op == BinaryOp::Subtract) {
    // dout itself (shared, never written in place) or its sums over the broadcast dims; for
    // subtract, the negated sums (the sum of -g is exactly -(sum of g)).
    Tensor gx = reduce_to_shape(dout, x.shape()), gy = reduce_to_shape(dout, y.shape());
    if (op == BinaryOp::Subtract) gy = negated(gy);
    return {gx, gy};
  }
  // Every element of both is written by the kernel.
  Tensor gx = Tensor::uninitialized(dtype, shape), gy = Tensor::uninitialized(dtype, shape);
  SW_DISPATCH(dtype, [&] { binary_grad_kernel<T>(op, x, y, dout, gx, gy); });
  (void)out;  // every gradient is recomputed from x and y: no dependence on the saved output
  return {reduce_to_shape(gx, x.shape()), reduce_to_shape(gy, y.shape())};
}

Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y) {
  SW_CHECK(cond.defined() && x.defined() && y.defined(), "where: an input is undefined");
  DType dtype = where_result_dtype(cond.dtype(), x.dtype(), y.dtype());
  Shape shape = broadcast_shapes(cond.shape(), x.shape(), y.shape());
  Tensor out = Tensor::uninitialized(dtype, shape);
  const bool* pc = cond.data<bool>();
  SW_DISPATCH(dtype, [&] {
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    T* po = out.data<T>();
    broadcast_for_each<3>(shape, {cond.shape(), x.shape(), y.shape()},
                          [&](int64_t i, const std::array<int64_t, 3>& o) { po[i] = pc[o[0]] ? px[o[1]] : py[o[2]]; });
  });
  return out;
}

BinaryGrads where_backward(const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& dout) {
  DType dtype = where_result_dtype(cond.dtype(), x.dtype(), y.dtype());
  Shape shape = broadcast_shapes(cond.shape(), x.shape(), y.shape());
  SW_CHECK(dout.defined() && dout.shape() == shape && dout.dtype() == dtype,
           "where backward: the output gradient must be {} {}, got {}", dtype_name(dtype), shape.to_string(),
           describe(dout));
  if (!is_floating(dtype)) return {};
  Tensor gx(dtype, shape), gy(dtype, shape);  // zero-filled
  const bool* pc = cond.data<bool>();
  SW_DISPATCH(dtype, [&] {
    const T* pg = dout.data<T>();
    T* gxp = gx.data<T>();
    T* gyp = gy.data<T>();
    broadcast_for_each<1>(shape, {cond.shape()}, [&](int64_t i, const std::array<int64_t, 1>& o) {
      (pc[o[0]] ? gxp : gyp)[i] = pg[i];
    });
  });
  return {reduce_to_shape(gx, x.shape()), reduce_to_shape(gy, y.shape())};
}

}  // namespace shardwise::ops
