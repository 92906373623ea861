#include "shardwise/ops/unary/kernels.h"

#include "shardwise/ops/sigmoid.h"

#include "shardwise/tensor/fast_math.h"
#include "shardwise/tensor/parallel.h"

#include <cmath>
#include <limits>
#include <type_traits>

namespace shardwise::ops {

namespace {

// sqrt(2/pi) and the cubic coefficient of the tanh-approximated GELU.
constexpr double kGeluK = 0.7978845608028654;
constexpr double kGeluC = 0.044715;

// tanh for GELU: the vectorizable float version for float (GELU adds it to 1, so its absolute
// error of < 3e-7 is below float rounding there), the exact one otherwise.
template <class C>
C gelu_tanh(C u) {
  if constexpr (std::is_same_v<C, float>) return fast_tanhf(u);
  else return std::tanh(u);
}

// y[i] = f(x[i]) over n elements, in the compute type of T.
template <class T, class F>
void map_floats(const T* x, T* y, int64_t n, F f) {
  using C = compute_t<T>;
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(f(static_cast<C>(x[i])));
}


template <class C>
C sign_of(C x) {
  return static_cast<C>((C(0) < x) - (x < C(0)));  // NaN -> 0, like PyTorch
}

template <class C>
C gelu_value(C v) {
  C u = static_cast<C>(kGeluK) * (v + static_cast<C>(kGeluC) * v * v * v);
  return C(0.5) * v * (C(1) + gelu_tanh(u));
}

template <class C>
C gelu_derivative(C v) {
  C k = static_cast<C>(kGeluK), c = static_cast<C>(kGeluC);
  C t = gelu_tanh(k * (v + c * v * v * v));
  return C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(3) * c * v * v);
}

// GELU of f32 (the MLP's activation, the largest elementwise op of a GPT step): the loops of
// unary_float / unary_grad_float, compiled for the widest vector unit.
SW_SIMD_CLONES void gelu_f32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}
SW_SIMD_CLONES void gelu_grad_f32(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_derivative(x[i]);
}

template <class T>
void unary_float(UnaryOp op, const T* x, T* y, int64_t n) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (op == UnaryOp::Gelu) return gelu_f32(x, y, n);
  }
  switch (op) {
    case UnaryOp::Abs: return map_floats(x, y, n, [](C v) { return std::abs(v); });
    case UnaryOp::Neg: return map_floats(x, y, n, [](C v) { return -v; });
    case UnaryOp::Exp: return map_floats(x, y, n, [](C v) { return std::exp(v); });
    case UnaryOp::Log: return map_floats(x, y, n, [](C v) { return std::log(v); });
    case UnaryOp::Sqrt: return map_floats(x, y, n, [](C v) { return std::sqrt(v); });
    case UnaryOp::Rsqrt: return map_floats(x, y, n, [](C v) { return C(1) / std::sqrt(v); });
    case UnaryOp::Reciprocal: return map_floats(x, y, n, [](C v) { return C(1) / v; });
    case UnaryOp::Sin: return map_floats(x, y, n, [](C v) { return std::sin(v); });
    case UnaryOp::Cos: return map_floats(x, y, n, [](C v) { return std::cos(v); });
    case UnaryOp::Tanh: return map_floats(x, y, n, [](C v) { return std::tanh(v); });
    case UnaryOp::Sigmoid: return map_floats(x, y, n, [](C v) { return sigmoid_of(v); });
    case UnaryOp::Relu: return map_floats(x, y, n, [](C v) { return v < C(0) ? C(0) : v; });  // keeps NaN
    case UnaryOp::Gelu: return map_floats(x, y, n, [](C v) { return gelu_value(v); });
    case UnaryOp::Silu: return map_floats(x, y, n, [](C v) { return v * sigmoid_of(v); });
    case UnaryOp::Square: return map_floats(x, y, n, [](C v) { return v * v; });
    case UnaryOp::Sign: return map_floats(x, y, n, [](C v) { return sign_of(v); });
  }
}

template <class T>
bool is_negative(T v) {
  if constexpr (std::is_signed_v<T>) {
    return v < T(0);
  } else {
    return false;
  }
}

// Integer ops compute in uint64_t: wraparound is defined there, and the C++20 conversion back to
// T is modular, so the result is the two's-complement wraparound PyTorch gives.
template <class T>
void unary_int(UnaryOp op, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    auto u = static_cast<uint64_t>(v);
    switch (op) {
      case UnaryOp::Abs: y[i] = is_negative(v) ? static_cast<T>(uint64_t{0} - u) : v; break;
      case UnaryOp::Neg: y[i] = static_cast<T>(uint64_t{0} - u); break;
      case UnaryOp::Square: y[i] = static_cast<T>(u * u); break;
      case UnaryOp::Sign: y[i] = static_cast<T>((T(0) < v) - is_negative(v)); break;
      default: fail("unary op '{}' has no integer kernel", unary_op_name(op));
    }
  }
}

// dx[i] = g(x[i], out[i], dy[i]) in the compute type. One loop per operand that is read (a null
// pointer passes 0): a load under a condition inside the loop would keep it from vectorizing.
template <class T, class G>
void map_grads(const T* x, const T* out, const T* dy, T* dx, int64_t n, G g) {
  using C = compute_t<T>;
  if (x && out) {
    for (int64_t i = 0; i < n; ++i)
      dx[i] = static_cast<T>(g(static_cast<C>(x[i]), static_cast<C>(out[i]), static_cast<C>(dy[i])));
  } else if (x) {
    for (int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(g(static_cast<C>(x[i]), C(0), static_cast<C>(dy[i])));
  } else if (out) {
    for (int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(g(C(0), static_cast<C>(out[i]), static_cast<C>(dy[i])));
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(g(C(0), C(0), static_cast<C>(dy[i])));
  }
}

template <class T>
void unary_grad_float(UnaryOp op, const T* x, const T* out, const T* dy, T* dx, int64_t n) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (op == UnaryOp::Gelu) return gelu_grad_f32(x, dy, dx, n);
  }
  switch (op) {
    case UnaryOp::Abs: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return g * sign_of(v); });
    case UnaryOp::Neg: return map_grads(x, out, dy, dx, n, [](C, C, C g) { return -g; });
    case UnaryOp::Exp: return map_grads(x, out, dy, dx, n, [](C, C o, C g) { return g * o; });
    case UnaryOp::Log: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return g / v; });
    case UnaryOp::Sqrt: return map_grads(x, out, dy, dx, n, [](C, C o, C g) { return g / (C(2) * o); });
    case UnaryOp::Rsqrt:
      return map_grads(x, out, dy, dx, n, [](C, C o, C g) { return g * (C(-0.5) * o * o * o); });
    case UnaryOp::Reciprocal:
      return map_grads(x, out, dy, dx, n, [](C, C o, C g) { return g * -(o * o); });
    case UnaryOp::Sin: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return g * std::cos(v); });
    case UnaryOp::Cos: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return g * -std::sin(v); });
    // The factor multiplying g is computed first and is >= 0 for the monotone ops (tanh, sigmoid,
    // exp, relu): the gradient rule relies on dx being a non-decreasing function of dy.
    case UnaryOp::Tanh: return map_grads(x, out, dy, dx, n, [](C, C o, C g) { return g * (C(1) - o * o); });
    case UnaryOp::Sigmoid:
      return map_grads(x, out, dy, dx, n, [](C, C o, C g) { return g * (o * (C(1) - o)); });
    case UnaryOp::Relu: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return v > C(0) ? g : C(0); });
    case UnaryOp::Gelu: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return g * gelu_derivative(v); });
    case UnaryOp::Silu:
      return map_grads(x, out, dy, dx, n, [](C v, C, C g) {
        C s = sigmoid_of(v);
        return g * (s * (C(1) + v * (C(1) - s)));
      });
    case UnaryOp::Square: return map_grads(x, out, dy, dx, n, [](C v, C, C g) { return g * (C(2) * v); });
    case UnaryOp::Sign: return map_grads(x, out, dy, dx, n, [](C, C, C) { return C(0); });
  }
}

enum class Reads { Nothing, X, Out };
Reads grad_reads(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: case UnaryOp::Sign: return Reads::Nothing;
    case UnaryOp::Exp: case UnaryOp::Sqrt: case UnaryOp::Rsqrt: case UnaryOp::Reciprocal:
    case UnaryOp::Tanh: case UnaryOp::Sigmoid: return Reads::Out;
    default: return Reads::X;
  }
}

void check_same(UnaryOp op, const Tensor& t, const Tensor& dy, const char* what) {
  SW_CHECK(t.defined(), "{} backward: {} is undefined", unary_op_name(op), what);
  SW_CHECK(t.dtype() == dy.dtype() && t.shape() == dy.shape(),
           "{} backward: {} is {} {} but the output gradient is {} {}", unary_op_name(op), what,
           dtype_name(t.dtype()), t.shape().to_string(), dtype_name(dy.dtype()), dy.shape().to_string());
}

bool is_whole(double v) {
  return std::isfinite(v) && std::trunc(v) == v && std::fabs(v) < 9.2e18;
}

// One element of cast(): see the rules in unary.h.
template <class Dst, class Src>
Dst convert(Src v) {
  if constexpr (std::is_same_v<Dst, bool>) {
    return static_cast<compute_t<Src>>(v) != compute_t<Src>(0);
  } else if constexpr (is_float_v<Dst>) {
    return static_cast<Dst>(static_cast<compute_t<Dst>>(static_cast<compute_t<Src>>(v)));
  } else if constexpr (is_float_v<Src>) {
    auto d = static_cast<double>(static_cast<compute_t<Src>>(v));
    if (std::isnan(d)) return Dst(0);
    d = std::trunc(d);
    // The limits as doubles: lowest is exact (0 or -2^k); max rounds up to 2^k, so >= saturates.
    if (d <= static_cast<double>(std::numeric_limits<Dst>::lowest())) return std::numeric_limits<Dst>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<Dst>::max())) return std::numeric_limits<Dst>::max();
    return static_cast<Dst>(d);
  } else {
    return static_cast<Dst>(v);  // integer or bool source: modular conversion
  }
}

}  // namespace

std::string_view unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Reciprocal: return "reciprocal";
    case UnaryOp::Sin: return "sin";
    case UnaryOp::Cos: return "cos";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::Square: return "square";
    case UnaryOp::Sign: return "sign";
  }
  fail("unknown unary op code {}", static_cast<int>(op));
}

bool unary_supports(UnaryOp op, DType dtype) {
  if (is_floating(dtype)) return true;
  if (!is_integral(dtype)) return false;
  return op == UnaryOp::Abs || op == UnaryOp::Neg || op == UnaryOp::Square || op == UnaryOp::Sign;
}

void check_unary_dtype(UnaryOp op, DType dtype) {
  SW_CHECK(unary_supports(op, dtype), "{}: input dtype {} is not supported; allowed: {}", unary_op_name(op),
           dtype_name(dtype),
           unary_supports(op, DType::I32) ? "f32, f64, f16, bf16, i64, i32, i8, u8" : "f32, f64, f16, bf16");
}

Tensor unary(UnaryOp op, const Tensor& x) {
  SW_CHECK(x.defined(), "{}: the input is undefined", unary_op_name(op));
  check_unary_dtype(op, x.dtype());
  Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
  SW_DISPATCH(x.dtype(), [&] {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    parallel_for(x.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
      if constexpr (is_float_v<T>) {
        unary_float<T>(op, xp + b, yp + b, e - b);
      } else if constexpr (!std::is_same_v<T, bool>) {
        unary_int<T>(op, xp + b, yp + b, e - b);
      }
    });
  });
  return y;
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& out, const Tensor& dy) {
  SW_CHECK(x.defined() && dy.defined(), "{} backward: the input or the output gradient is undefined",
           unary_op_name(op));
  check_unary_dtype(op, x.dtype());
  SW_CHECK(x.dtype() == dy.dtype(), "{} backward: input is {} but the output gradient is {}", unary_op_name(op),
           dtype_name(x.dtype()), dtype_name(dy.dtype()));
  if (!is_floating(x.dtype())) return {};  // integer inputs take no gradient
  Reads reads = grad_reads(op);
  if (reads == Reads::X) check_same(op, x, dy, "the input");
  if (reads == Reads::Out) check_same(op, out, dy, "the output");
  Tensor dx = Tensor::uninitialized(dy.dtype(), dy.shape());
  SW_DISPATCH(dy.dtype(), [&] {
    if constexpr (is_float_v<T>) {
      const T* xp = reads == Reads::X ? x.data<T>() : nullptr;
      const T* op_ = reads == Reads::Out ? out.data<T>() : nullptr;
      const T* dyp = dy.data<T>();
      T* dxp = dx.data<T>();
      parallel_for(dy.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
        if constexpr (is_float_v<T>)  // (again: GCC instantiates this lambda for every T)
          unary_grad_float<T>(op, xp ? xp + b : nullptr, op_ ? op_ + b : nullptr, dyp + b, dxp + b, e - b);
      });
    }
  });
  return dx;
}

void check_scale_args(DType dtype, double scale, double bias) {
  SW_CHECK(dtype != DType::Bool, "scale: input dtype bool is not supported; allowed: f32, f64, f16, bf16, "
                                 "i64, i32, i8, u8");
  if (is_integral(dtype)) {
    SW_CHECK(is_whole(scale) && is_whole(bias),
             "scale: an integer input ({}) needs whole-number scale and bias, got scale={} bias={}",
             dtype_name(dtype), scale, bias);
  }
}

Tensor scale(const Tensor& x, double scale, double bias, bool bias_after_scale) {
  SW_CHECK(x.defined(), "scale: the input is undefined");
  check_scale_args(x.dtype(), scale, bias);
  Tensor y = Tensor::uninitialized(x.dtype(), x.shape());
  int64_t n = x.numel();
  SW_DISPATCH(x.dtype(), [&] {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    if constexpr (is_float_v<T>) {
      using C = compute_t<T>;
      auto s = static_cast<C>(scale), b = static_cast<C>(bias);
      parallel_for(n, kParallelGrain, [&](int64_t i0, int64_t i1) {
        if (bias_after_scale) {
          map_floats(xp + i0, yp + i0, i1 - i0, [&](C v) { return s * v + b; });
        } else {
          map_floats(xp + i0, yp + i0, i1 - i0, [&](C v) { return s * (v + b); });
        }
      });
    } else if constexpr (!std::is_same_v<T, bool>) {
      // Whole-number scale and bias, wraparound arithmetic in uint64_t (see unary_int).
      auto s = static_cast<uint64_t>(static_cast<int64_t>(scale));
      auto b = static_cast<uint64_t>(static_cast<int64_t>(bias));
      for (int64_t i = 0; i < n; ++i) {
        auto u = static_cast<uint64_t>(xp[i]);
        yp[i] = static_cast<T>(bias_after_scale ? s * u + b : s * (u + b));
      }
    }
  });
  return y;
}

Tensor scale_backward(const Tensor& dy, double scale) {
  SW_CHECK(dy.defined(), "scale backward: the output gradient is undefined");
  if (!is_floating(dy.dtype())) return {};
  Tensor dx = Tensor::uninitialized(dy.dtype(), dy.shape());
  SW_DISPATCH(dy.dtype(), [&] {
    if constexpr (is_float_v<T>) {
      using C = compute_t<T>;
      auto s = static_cast<C>(scale);
      const T* dyp = dy.data<T>();
      T* dxp = dx.data<T>();
      parallel_for(dy.numel(), kParallelGrain, [&](int64_t b, int64_t e) {
        map_floats(dyp + b, dxp + b, e - b, [&](C g) { return s * g; });
      });
    }
  });
  return dx;
}

Tensor cast(const Tensor& x, DType dtype) {
  SW_CHECK(x.defined(), "cast: the input is undefined");
  Tensor y(dtype, x.shape());
  int64_t n = x.numel();
  SW_DISPATCH(x.dtype(), [&] {
    using Src = T;
    const Src* src = x.data<Src>();
    SW_DISPATCH(dtype, [&] {
      T* dst = y.data<T>();
      for (int64_t i = 0; i < n; ++i) dst[i] = convert<T, Src>(src[i]);
    });
  });
  return y;
}

Tensor cast_backward(const Tensor& dy, DType input_dtype) {
  SW_CHECK(dy.defined(), "cast backward: the output gradient is undefined");
  if (!is_floating(input_dtype)) return {};
  return cast(dy, input_dtype);
}

}  // namespace shardwise::ops
