#pragma once
// GEMMs through cuBLASLt on row-major device memory: one cuBLASLt handle per device and one
// workspace per (device, stream), made on first use and kept; the algorithm for a shape (dtypes,
// transposes, sizes, strides, pointer alignments, TF32) asked of cuBLASLt's heuristic once and
// kept, so the same shape always runs the same algorithm (deterministic: no split-K atomics in
// cuBLASLt, and the workspace size is fixed). f32 computes in f32 unless `tf32` (an explicit
// choice, off by default); bf16 inputs accumulate in f32 and write bf16 or f32.
#include <cstdint>

#include "shardwise/core/dtype.h"
#include "shardwise/tensor/device.h"

namespace shardwise::cuda {

// c[i] = alpha * op(a[i]) op(b[i]) + beta * c[i] for i < batch, row-major: op(a) is [m, k] (a is
// stored [k, m] when trans_a), op(b) is [k, n] (stored [n, k] when trans_b), c is [m, n]; the
// batch items lie stride_* elements apart (0: one matrix for every item; c's stride must not be 0
// unless batch is 1). Leading dimensions are the stored row lengths (dense matrices).
struct GemmSpec {
  DType in = DType::F32;   // a and b: f32 or bf16
  DType out = DType::F32;  // c: f32, or bf16 when `in` is bf16
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool tf32 = false;  // f32 inputs only: TF32 tensor cores (about 10 bits of mantissa)
};

// Runs the GEMM on `stream` of `device` (asynchronous). k = 0 leaves c as it is (the caller zeroes
// it for beta = 0). Error naming the
// problem for an unsupported dtype pair, a negative size, or what cuBLASLt reports.
void gemm(Device device, Stream stream, const GemmSpec& spec, const void* a, const void* b, void* c);

// How many distinct shapes asked the heuristic (each once) and how many GEMMs ran, this process.
struct BlasStats {
  int64_t heuristic_queries = 0, gemms = 0;
};
BlasStats blas_stats();

}  // namespace shardwise::cuda
