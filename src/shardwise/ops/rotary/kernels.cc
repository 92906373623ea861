#include "shardwise/ops/rotary/kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

namespace {

// inv_freq[i] = 1 / theta^(2i / D) in C: in float as transformers computes it (the exponent
// 2i / D in float, the power rounded to float, its reciprocal in float).
template <class C>
std::vector<C> inverse_frequencies(int64_t D, double theta) {
  std::vector<C> inv(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    const C e = static_cast<C>(2 * i) / static_cast<C>(D);
    const C p = static_cast<C>(std::pow(static_cast<double>(static_cast<C>(theta)), static_cast<double>(e)));
    inv[static_cast<size_t>(i)] = C(1) / p;
  }
  return inv;
}

int64_t position_at(const Tensor& positions, int64_t i) {
  return positions.dtype() == DType::I32 ? positions.data<int32_t>()[i] : positions.data<int64_t>()[i];
}

// Rotates every row [.., s, :] of x by its position's angles; `sign` -1 rotates back (the gradient).
// Positions [S] serve every row of dim -2 alike; positions [B, S] give each of the B blocks of x's
// dim 0 (`rows / B` rows each, S per inner slice) its own row of positions.
template <class T>
void rotate(const T* x, T* out, const Tensor& positions, int64_t rows, int64_t S, int64_t D, double theta, int sign) {
  using C = compute_t<T>;
  const int64_t h = D / 2, P = positions.numel();  // S, or B * S
  const int64_t B = P / std::max<int64_t>(S, 1), per_batch = B ? rows / B : 0;
  const std::vector<C> inv = inverse_frequencies<C>(D, theta);
  std::vector<C> cos_t(static_cast<size_t>(P * h)), sin_t(static_cast<size_t>(P * h));
  for (int64_t p = 0; p < P; ++p) {
    const C pos = static_cast<C>(position_at(positions, p));
    for (int64_t i = 0; i < h; ++i) {
      const C a = pos * inv[static_cast<size_t>(i)];
      cos_t[static_cast<size_t>(p * h + i)] = static_cast<C>(std::cos(a));
      sin_t[static_cast<size_t>(p * h + i)] = static_cast<C>(sign) * static_cast<C>(std::sin(a));
    }
  }
  parallel_for(rows, kParallelGrain / std::max<int64_t>(D, 1) + 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = (positions.shape().ndim() == 2 ? (r / per_batch) * S : 0) + r % S;
      const C* c = cos_t.data() + p * h;
      const C* sn = sin_t.data() + p * h;
      const T* xr = x + r * D;
      T* o = out + r * D;
      for (int64_t i = 0; i < h; ++i) {
        const C a = static_cast<C>(xr[i]), b = static_cast<C>(xr[i + h]);
        o[i] = static_cast<T>(a * c[i] - b * sn[i]);
        o[i + h] = static_cast<T>(b * c[i] + a * sn[i]);
      }
    }
  });
}

Tensor rotate_tensor(const Tensor& x, const Tensor& positions, double theta, int sign) {
  const int64_t D = x.shape()[x.ndim() - 1], S = x.shape()[x.ndim() - 2];
  Tensor out = Tensor::uninitialized(x.dtype(), x.shape());
  const int64_t rows = D == 0 ? 0 : x.numel() / D;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    rotate(x.data<T>(), out.data<T>(), positions, rows, S, D, theta, sign);
  };
  switch (x.dtype()) {
    case DType::F32: run(float{}); break;
    case DType::F64: run(double{}); break;
    case DType::F16: run(f16{}); break;
    case DType::BF16: run(bf16{}); break;
    default: fail("rotary_embedding: {} is not a floating dtype", dtype_name(x.dtype()));
  }
  return out;
}

}  // namespace

void check_rotary_inputs(const Shape& x, DType x_dtype, const Shape& positions, DType positions_dtype, double theta) {
  SW_CHECK(x.ndim() >= 2, "rotary_embedding: x must be [..., S, D] (at least 2 dims), got {}", x.to_string());
  SW_CHECK(is_floating(x_dtype), "rotary_embedding: x holds {} (allowed: f32, f64, f16, bf16)", dtype_name(x_dtype));
  const int64_t D = x[x.ndim() - 1], S = x[x.ndim() - 2];
  SW_CHECK(D % 2 == 0, "rotary_embedding: the last dim of x {} (the head dim) must be even to rotate its halves",
           x.to_string());
  const bool shared = positions.ndim() == 1 && positions[0] == S;
  const bool per_batch = positions.ndim() == 2 && x.ndim() >= 3 && positions[0] == x[0] && positions[1] == S;
  SW_CHECK(shared || per_batch,
           "rotary_embedding: positions must be [{}] (one per row of x's dim -2, x {}){}, got {}", S, x.to_string(),
           x.ndim() >= 3 ? fmt::format(" or [{}, {}] (per x's dim 0 too)", x[0], S) : std::string(),
           positions.to_string());
  SW_CHECK(positions_dtype == DType::I64 || positions_dtype == DType::I32,
           "rotary_embedding: positions hold {} (allowed: i64, i32)", dtype_name(positions_dtype));
  SW_CHECK(theta > 0 && std::isfinite(theta), "rotary_embedding: theta must be a positive number, got {}", theta);
}

Tensor rotary_embedding(const Tensor& x, const Tensor& positions, double theta) {
  check_rotary_inputs(x.shape(), x.dtype(), positions.shape(), positions.dtype(), theta);
  return rotate_tensor(x, positions, theta, 1);
}

Tensor rotary_embedding_backward(const Tensor& dout, const Tensor& positions, double theta) {
  check_rotary_inputs(dout.shape(), dout.dtype(), positions.shape(), positions.dtype(), theta);
  return rotate_tensor(dout, positions, theta, -1);
}

}  // namespace shardwise::ops
