#pragma once
// Strided, batched GEMM on row-major matrices: what every op family that multiplies matrices shares.
//
//   C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]     for b = 0, 1, ..., batch - 1 (in order)
//
// op(X) is X or X^T; op(A) is m x k, op(B) is k x n, C is m x n. f32 runs on the GEMM backend
// (tensor/gemm_backend.h: OpenBLAS, BLIS or oneDNN), f64 on OpenBLAS;
// f16 / bf16 run the f32 backend on their values widened to f32 (f32 accumulation, one rounding of C); i32 / i64 accumulate in 64-bit two's complement (exact unless
// the true result overflows int64, in which case it wraps). beta == 0 overwrites C without
// reading it (a NaN in C does not survive). k == 0 gives beta * C (zeros for beta == 0).
// Batches run in order, so stride_c == 0 with beta == 1 accumulates the sum over the batch.
#include <cstdint>

#include "shardwise/core/dtype.h"
#include "shardwise/core/shape.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise {

struct GemmArgs {
  bool trans_a = false;  // A is stored k x m (op(A) = A^T)
  bool trans_b = false;  // B is stored n x k (op(B) = B^T)
  int64_t m = 0, n = 0, k = 0;
  // Row strides (elements) of the stored matrices: lda >= columns of stored A (k, or m when
  // trans_a), ldb >= columns of stored B (n, or k when trans_b), ldc >= n. -1: packed.
  int64_t lda = -1, ldb = -1, ldc = -1;
  int64_t batch = 1;
  // Elements between consecutive batch items; 0 repeats the same matrix. -1: packed (rows * ld).
  int64_t stride_a = -1, stride_b = -1, stride_c = -1;
  double alpha = 1.0;
  double beta = 0.0;  // integer dtypes: alpha and beta must be whole numbers
};

// op(A) [m, k] · op(B) [k, n] into C [m, n] (C = op(A) op(B) + beta C), packed operands; set the
// other fields (leading dims, batch) on the result where they differ.
inline GemmArgs gemm_args(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double beta = 0.0) {
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.beta = beta;
  return g;
}

// Fills the -1 fields of `args` with their packed values and checks every field; Error names the
// bad field and what is allowed.
GemmArgs resolve_gemm_args(const GemmArgs& args);

// Type-erased entry point: dispatches on `dtype` (f32, f64, f16, bf16, i32, i64; others: Error).
void gemm(DType dtype, const GemmArgs& args, const void* a, const void* b, void* c);

template <class T>
void gemm(const GemmArgs& args, const T* a, const T* b, T* c) {
  gemm(dtype_v<T>, args, a, b, c);
}

// Tensor form: a and b are 2-D, or 3-D with equal batch (a batch of 1 broadcasts);
// returns op(a) * op(b) as a new tensor ([m, n] or [batch, m, n]).
Tensor gemm(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

bool gemm_supports(DType dtype);

}  // namespace shardwise

namespace shardwise {
// Threads the GEMM libraries may use per call (ranks that run as threads each call it: 1 avoids
// oversubscribing the cores). <= 0 leaves each library's default.
void set_blas_threads(int threads);
// Threads a GEMM call may use: set_blas_threads' last value, else OpenBLAS's own count
// (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS or the cores). A rank's kernel pool gets as many
// (tensor/parallel.h), so the cores a rank uses are the same inside and outside GEMMs.
int blas_threads();
// set_blas_threads' last request (0: none, each library runs its default count).
int blas_threads_requested();
// The threads OpenBLAS runs a call on now (1 while a pool splits the GEMMs).
int gemm_library_threads();
// A rank's pool of more than one thread splits the rank's GEMMs itself (tensor/parallel.h's
// RankThreads): between gemm_split_begin and the matching gemm_split_end (nested: counted) every
// GEMM library call runs on one thread (the pool's threads are the GEMM's), and blas_threads()
// still answers the count requested before.
void gemm_split_begin();
void gemm_split_end();
bool gemm_split_active();
}  // namespace shardwise
