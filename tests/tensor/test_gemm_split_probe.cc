// The split probe (tensor/gemm_split_probe.h) against SGEMMs whose summation order is known: one
// that sums every C element's k terms in one fixed order keeps its bits in every block, one whose
// order depends on the size of the block it is called for does not; and the loaded library is
// split only where the probe found that it keeps its bits.
#include <gtest/gtest.h>

#include <iostream>

#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/gemm_backend.h"
#include "shardwise/tensor/gemm_split_probe.h"

namespace shardwise {
namespace {

// Row-major C = alpha op(A) op(B) + beta C, summing k forward, or backward when `backward` says so
// for this call's block.
SgemmFn naive_sgemm(std::function<bool(int m, int n)> backward) {
  return [backward](bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) {
    const bool back = backward(m, n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        float s = 0;
        for (int q = 0; q < k; ++q) {
          const int p = back ? k - 1 - q : q;
          s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
        }
        c[i * ldc + j] = alpha * s + (beta == 0 ? 0.0f : beta * c[i * ldc + j]);
      }
    }
  };
}

TEST(GemmSplitProbe, AnSgemmWithOneSummationOrderKeepsItsBits) {
  EXPECT_TRUE(sgemm_split_keeps_bits(naive_sgemm([](int, int) { return false; })));
}

TEST(GemmSplitProbe, AnSgemmWhoseOrderDependsOnTheBlockIsFound) {
  // Backward on blocks of fewer rows than the whole (a row split) ...
  EXPECT_FALSE(sgemm_split_keeps_bits(naive_sgemm([](int m, int) { return m < 256; })));
  // ... and on blocks of fewer columns (a column split).
  EXPECT_FALSE(sgemm_split_keeps_bits(naive_sgemm([](int, int n) { return n < 256; })));
}

TEST(GemmSplitProbe, CutsTileTheExtentAtMultiplesOfTheCut) {
  for (int64_t extent : {1, 15, 16, 17, 640, 1000}) {
    for (int64_t pieces : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int64_t p = 0; p < pieces; ++p) {
        const SplitRange r = split_range(extent, kGemmCut, pieces, p);
        EXPECT_EQ(r.lo, next) << extent << " in " << pieces;
        EXPECT_TRUE(r.lo % kGemmCut == 0 || r.lo == extent) << extent << " in " << pieces;
        next = std::max(r.lo, r.hi);
      }
      EXPECT_EQ(next, extent) << extent << " in " << pieces;
    }
  }
}

// The loaded library: split only where it keeps its bits (said in the test's output, so a machine
// whose GEMMs run unsplit is visible: GemmSplit.* then check the unsplit path's bits).
TEST(GemmSplitProbe, TheLoadedLibraryIsSplitOnlyWhereItKeepsItsBits) {
  const bool keeps = gemm_split_keeps_bits();
  std::cout << gemm_backend().library << (keeps ? ": GEMMs split over a rank's threads (same bits in every block)"
                                                : ": other bits in blocks: GEMMs run whole on one thread")
            << "\n";
  EXPECT_EQ(keeps, sgemm_split_keeps_bits(backend_sgemm));
}

}  // namespace
}  // namespace shardwise

namespace shardwise {
namespace {

// tests/support/suite_environment.cc is in effect under ctest as in a direct run: one OpenBLAS
// thread a call, OpenBLAS's own pick (ctest's ENVIRONMENT property once passed neither).
TEST(SuiteEnvironment, OpenBlasRunsOneThreadACallAndIsTheBackend) {
  EXPECT_EQ(blas_threads(), 1);
  EXPECT_EQ(gemm_library_threads(), 1);
  EXPECT_EQ(gemm_backend().name, "openblas");
}

}  // namespace
}  // namespace shardwise
