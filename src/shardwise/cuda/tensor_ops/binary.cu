// Broadcasting binary elementwise ops (add, sub, mul, div, maximum, minimum) forward and their
// full-shape gradients, in float for f32 / bf16 / f16, as ops/binary's CPU kernels compute them
// (maximum / minimum: NaN propagates, a tie splits the gradient half / half).
#include "shardwise/cuda/common/block_reduce.cuh"
#include "shardwise/cuda/common/walk.cuh"

namespace shardwise::cuda::launch {

namespace {

using namespace detail;

__device__ float apply(Binary op, float a, float b) {
  switch (op) {
    case Binary::Add: return a + b;
    case Binary::Sub: return a - b;
    case Binary::Mul: return a * b;
    case Binary::Div: return a / b;
    case Binary::Max: return isnan(a) ? a : isnan(b) ? b : (a < b ? b : a);
    case Binary::Min: return isnan(a) ? a : isnan(b) ? b : (b < a ? b : a);
  }
  return 0.0f;
}

// The share of the gradient x takes under maximum / minimum.
__device__ float selection_weight(Binary op, float a, float b) {
  if (isnan(a)) return 1.0f;
  if (isnan(b)) return 0.0f;
  if (a == b) return 0.5f;
  return (op == Binary::Max ? a > b : a < b) ? 1.0f : 0.0f;
}

template <class T>
__global__ void forward_kernel(Binary op, const T* x, const T* y, T* out, long long n, Walk w) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const Offsets<3> o = walk_offsets<3>(w, i);
    out[o.at[2]] = from_f<T>(apply(op, to_f(x[o.at[0]]), to_f(y[o.at[1]])));
  }
}

template <class T>
__global__ void backward_kernel(Binary op, const T* x, const T* y, const T* dout, T* gx, T* gy, long long n, Walk w) {
  for (long long i = first_index(); i < n; i += grid_step()) {
    const Offsets<2> o = walk_offsets<2>(w, i);
    const float a = to_f(x[o.at[0]]), b = to_f(y[o.at[1]]), g = to_f(dout[i]);
    float da = g, db = g;
    switch (op) {
      case Binary::Add: break;
      case Binary::Sub: db = -g; break;
      case Binary::Mul: da = g * b; db = g * a; break;
      case Binary::Div: da = g / b; db = -(g / b) * (a / b); break;
      case Binary::Max:
      case Binary::Min: {
        const float s = selection_weight(op, a, b);
        da = g * s;
        db = g * (1.0f - s);
        break;
      }
    }
    gx[i] = from_f<T>(da);
    gy[i] = from_f<T>(db);
  }
}

template <class T>
int forward_as(Binary op, const void* x, const void* y, void* out, const Walk& w, void* s) {
  const long long n = w.numel();
  if (n == 0) return cudaSuccess;
  forward_kernel<T><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      op, static_cast<const T*>(x), static_cast<const T*>(y), static_cast<T*>(out), n, w);
  return cudaGetLastError();
}

template <class T>
int backward_as(Binary op, const void* x, const void* y, const void* dout, void* gx, void* gy, const Walk& w, void* s) {
  const long long n = w.numel();
  if (n == 0) return cudaSuccess;
  backward_kernel<T><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(s)>>>(
      op, static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dout), static_cast<T*>(gx),
      static_cast<T*>(gy), n, w);
  return cudaGetLastError();
}

}  // namespace

int binary_forward(Binary op, Elem t, const void* x, const void* y, void* out, const Walk& w, void* s) {
  switch (t) {
    case Elem::F32: return forward_as<float>(op, x, y, out, w, s);
    case Elem::BF16: return forward_as<__nv_bfloat16>(op, x, y, out, w, s);
    case Elem::F16: return forward_as<__half>(op, x, y, out, w, s);
  }
  return cudaErrorInvalidValue;
}

int binary_backward(Binary op, Elem t, const void* x, const void* y, const void* dout, void* gx, void* gy,
                    const Walk& w, void* s) {
  switch (t) {
    case Elem::F32: return backward_as<float>(op, x, y, dout, gx, gy, w, s);
    case Elem::BF16: return backward_as<__nv_bfloat16>(op, x, y, dout, gx, gy, w, s);
    case Elem::F16: return backward_as<__half>(op, x, y, dout, gx, gy, w, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace shardwise::cuda::launch
