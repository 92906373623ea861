#pragma once
// The raw launchers of the elementwise, reduction and layout kernels (binary.cu, unary.cu,
// reduce.cu, copy.cu): device pointers, index layouts of at most 8 dims and a stream, no tensors
// (launchers.h says why). Each returns the launch's cudaError_t (as int); elementwise.h and
// layout.h wrap them for device tensors and say what each computes.
#include <cstdint>

namespace shardwise::cuda::launch {

enum class Elem : uint8_t { F32, BF16, F16 };  // the floating element types the kernels take
inline constexpr int kDims = 8;

// An index space of `ndim` dims and, per operand, the element stride of each dim (0: broadcast)
// and a base offset. Element i of the space (row-major) is operand k's element
// offset[k] + sum_d idx_d * stride[k][d].
struct Walk {
  int ndim = 0;
  int64_t shape[kDims] = {};
  int64_t stride[3][kDims] = {};
  int64_t offset[3] = {};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
};

enum class Binary : uint8_t { Add, Sub, Mul, Div, Max, Min };
// out[i] = op(x[w 0], y[w 1]) over the walk (out is operand 2), computed in float.
int binary_forward(Binary op, Elem t, const void* x, const void* y, void* out, const Walk& w, void* s);
// gx[i], gy[i] (both of the walk's shape, contiguous) = the op's partial derivatives times
// dout[i], from x[w 0], y[w 1]; rounded to `t` (the caller sums them back to the operands' shapes).
int binary_backward(Binary op, Elem t, const void* x, const void* y, const void* dout, void* gx, void* gy,
                    const Walk& w, void* s);

enum class Unary : uint8_t { Neg, Exp, Log, Sqrt, Rsqrt, Reciprocal, Tanh, Sigmoid, Relu, Square, Abs, Gelu, Silu };
int unary_forward(Unary op, Elem t, const void* x, void* out, int64_t n, void* s);
// dx = dy * f'(x), from x and out = f(x) as ops::unary_backward takes them.
int unary_backward(Unary op, Elem t, const void* x, const void* out, const void* dy, void* dx, int64_t n, void* s);
// SwiGLU: out = silu(gate) * up; its backward dgate = dout * up * silu'(gate), dup = dout * silu(gate).
int swiglu_forward(Elem t, const void* gate, const void* up, void* out, int64_t n, void* s);
int swiglu_backward(Elem t, const void* gate, const void* up, const void* dout, void* dgate, void* dup, int64_t n,
                    void* s);
// out = scale * x + bias (bias_after_scale) or scale * (x + bias), in float.
int scale(Elem t, const void* x, void* out, int64_t n, float scale, float bias, bool bias_after_scale, void* s);
// out = x converted (nearest, through float).
int cast(Elem from, Elem to, const void* x, void* out, int64_t n, void* s);
// out[i] = value for n elements of `bytes` bytes each (the value's bit pattern).
int fill(int bytes, uint64_t bits, void* out, int64_t n, void* s);

// out[j] = (sum over the reduced index space of x) / divisor, in double, rounded once; `kept` walks
// the outputs (operand 0: x's strides, out contiguous), `reduced` the elements summed into one
// (operand 0: x's strides). One thread per output, summing in a fixed order: deterministic.
int reduce_sum(Elem t, const void* x, void* out, const Walk& kept, const Walk& reduced, double divisor, void* s);

// Dropout: element i of the walk (operand 0: its GLOBAL row-major index in the whole tensor) is kept
// iff Philox-4x32-10 (seed, stream)'s uniform at that index is >= p (core/philox.h's draw);
// mask[i] = kept, out[i] = x[i] * (kept ? scale : 0) in float. x, out and mask are contiguous.
int dropout_forward(Elem t, const void* x, void* out, uint8_t* mask, const Walk& global, uint64_t seed,
                    uint64_t stream, double p, float scale, void* s);
// out[i] = x[i] * (mask[i] ? scale : 0) in float (dropout's backward).
int dropout_apply(Elem t, const void* x, const uint8_t* mask, void* out, int64_t n, float scale, void* s);

// dst[w 1] = src[w 0] over the walk, elements of `bytes` (1, 2, 4 or 8) bytes.
int strided_copy(int bytes, const void* src, void* dst, const Walk& w, void* s);

}  // namespace shardwise::cuda::launch
