#pragma once
// Whether a GEMM library gives the same bits when C is computed in blocks. tensor/gemm.cc splits a
// rank's f32 GEMMs into row or column blocks of C, one library call each, so that a rank's results
// do not depend on how many kernel threads it has. That holds only where the library sums each C
// element's k terms in the same order whatever the block: true of OpenBLAS's blocked kernels on
// most cores, false of others (OpenBLAS 0.3.21's Haswell kernels, which OPENBLAS_CORETYPE=Haswell
// selects on an AVX-512 machine, give other bits for most blocks). The probe runs a few GEMMs of
// the training step's kind whole and in the blocks 2, 3 and 4 threads would cut, and compares the
// bits; where they differ, the GEMMs are not split (each runs as one call on one thread).
#include <cstdint>
#include <functional>

namespace shardwise {

// A row-major SGEMM with backend_sgemm's arguments: C = alpha op(A) op(B) + beta C.
using SgemmFn = std::function<void(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                                   const float* b, int ldb, float beta, float* c, int ldc)>;

// The split's cuts fall at multiples of kGemmCut rows or columns (the library kernels' unrolls).
inline constexpr int64_t kGemmCut = 16;

// Piece p of `pieces` of [0, extent), cut at multiples of `cut`: the rows (or columns) of C one
// library call computes when a GEMM is split.
struct SplitRange {
  int64_t lo, hi;
};
SplitRange split_range(int64_t extent, int64_t cut, int64_t pieces, int64_t p);

// True when `sgemm` gives bit-identical C in every row and column split the probe tries.
bool sgemm_split_keeps_bits(const SgemmFn& sgemm);

// sgemm_split_keeps_bits of the loaded backend, probed once per backend (cached by its name).
bool gemm_split_keeps_bits();

}  // namespace shardwise
