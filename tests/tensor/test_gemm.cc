// GEMM kernels against a naive double-precision triple loop written here, and hand-computed products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise {
namespace {

// Deterministic pseudo-random values in [-2, 2) with a few exact small integers mixed in.
std::vector<double> values(int64_t n, int seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(seed + 1);
  for (auto& e : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<double>(s >> 11) / static_cast<double>(1ull << 53) * 4.0 - 2.0;
  }
  return v;
}

// Reference: element (i, j) of batch b of alpha * op(A) op(B) + beta * C, all in double.
// Stored A has row stride lda; op(A)(i, p) = trans ? A[p][i] : A[i][p].
std::vector<double> reference(const GemmArgs& g, const std::vector<double>& a, const std::vector<double>& b,
                              const std::vector<double>& c0) {
  std::vector<double> c = c0;
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          double av = g.trans_a ? a[static_cast<size_t>(bi * g.stride_a + p * g.lda + i)]
                                : a[static_cast<size_t>(bi * g.stride_a + i * g.lda + p)];
          double bv = g.trans_b ? b[static_cast<size_t>(bi * g.stride_b + j * g.ldb + p)]
                                : b[static_cast<size_t>(bi * g.stride_b + p * g.ldb + j)];
          sum += av * bv;
        }
        auto& e = c[static_cast<size_t>(bi * g.stride_c + i * g.ldc + j)];
        e = g.alpha * sum + (g.beta == 0 ? 0.0 : g.beta * e);
      }
    }
  }
  return c;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  std::vector<T> out;
  for (double e : v) out.push_back(static_cast<T>(static_cast<compute_t<T>>(e)));
  return out;
}

int64_t buffer_size(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return (batch > 0 ? (batch - 1) * stride : 0) + rows * ld;
}

// Runs gemm<T> on random data laid out per `args` and compares with the double reference.
template <class T>
void check_against_reference(GemmArgs args, double tol, int seed) {
  GemmArgs g = resolve_gemm_args(args);
  int64_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
  auto a = values(buffer_size(g.batch, g.stride_a, a_rows, g.lda), seed);
  auto b = values(buffer_size(g.batch, g.stride_b, b_rows, g.ldb), seed + 1);
  auto c = values(buffer_size(g.batch, g.stride_c, g.m, g.ldc), seed + 2);
  if constexpr (!is_float_v<T>) {
    for (auto* v : {&a, &b, &c}) {
      for (double& e : *v) e = std::round(e * 3);
    }
  }
  // Round the inputs through T so that the reference sees the same values.
  auto at = cast<T>(a), bt = cast<T>(b), ct = cast<T>(c);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<compute_t<T>>(at[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<compute_t<T>>(bt[i]);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<compute_t<T>>(ct[i]);
  auto expected = reference(g, a, b, c);
  gemm<T>(args, at.data(), bt.data(), ct.data());
  for (size_t i = 0; i < expected.size(); ++i) {
    double got = static_cast<compute_t<T>>(ct[i]);
    ASSERT_NEAR(got, expected[i], tol * (1 + std::fabs(expected[i])))
        << "element " << i << " m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.trans_a
        << " tb=" << g.trans_b << " batch=" << g.batch;
  }
}

template <class T>
void check_all_layouts(double tol) {
  int seed = 0;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [m, n, k] : {std::array<int64_t, 3>{3, 4, 5}, {1, 7, 2}, {6, 1, 9}, {5, 3, 1}}) {
        GemmArgs g = gemm_args(ta, tb, m, n, k);
        check_against_reference<T>(g, tol, seed++);
        // Padded leading dims, a batch of 3 with a broadcast B, alpha and beta.
        g.lda = (ta ? m : k) + 2;
        g.ldb = (tb ? k : n) + 1;
        g.ldc = n + 3;
        g.batch = 3;
        g.stride_b = 0;
        g.alpha = 2;
        g.beta = -1;
        check_against_reference<T>(g, tol, seed++);
      }
    }
  }
}

TEST(Gemm, F64MatchesNaiveLoop) { check_all_layouts<double>(1e-12); }
TEST(Gemm, F32MatchesNaiveLoop) { check_all_layouts<float>(1e-5); }
TEST(Gemm, F16MatchesNaiveLoop) { check_all_layouts<f16>(4e-3); }
TEST(Gemm, BF16MatchesNaiveLoop) { check_all_layouts<bf16>(3e-2); }
// bf16 runs the f32 GEMM on its values widened (exact) and rounds C once: bit for bit the f32 GEMM's
// result of the same values, rounded. A sum of its own (the naive loop's order, no FMA) differs
// from the blocked f32 kernels in the last f32 bits, which flips some of the 65536 roundings at k = 1024.
TEST(Gemm, BF16IsTheF32GemmOfItsValuesRoundedOnce) {
  for (bool tb : {false, true}) {
    const int64_t m = 256, n = 256, k = 1024;
    GemmArgs g = gemm_args(false, tb, m, n, k);
    auto a = cast<bf16>(values(m * k, 7)), b = cast<bf16>(values(k * n, 8));
    std::vector<float> fa(a.begin(), a.end()), fb(b.begin(), b.end()), fc(static_cast<size_t>(m * n));
    std::vector<bf16> c(static_cast<size_t>(m * n));
    gemm<float>(g, fa.data(), fb.data(), fc.data());
    gemm<bf16>(g, a.data(), b.data(), c.data());
    int64_t differ = 0;
    for (size_t i = 0; i < c.size(); ++i) differ += static_cast<float>(c[i]) != static_cast<float>(static_cast<bf16>(fc[i]));
    EXPECT_EQ(differ, 0) << "trans_b=" << tb;
  }
}

TEST(Gemm, I64MatchesNaiveLoopExactly) { check_all_layouts<int64_t>(0); }
TEST(Gemm, I32MatchesNaiveLoopExactly) { check_all_layouts<int32_t>(0); }

TEST(Gemm, HandComputedProduct) {
  // [1 2 3; 4 5 6] * [7 8; 9 10; 11 12] = [58 64; 139 154]
  std::vector<double> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12}, c(4, -1);
  GemmArgs g;
  g.m = 2;
  g.n = 2;
  g.k = 3;
  gemm<double>(g, a.data(), b.data(), c.data());
  EXPECT_EQ(c, (std::vector<double>{58, 64, 139, 154}));
  // A^T with A stored [3, 2]: [1 3 5; 2 4 6] * B = [1*7+3*9+5*11, ...] = [89 98; 116 128]
  std::vector<double> at = {1, 2, 3, 4, 5, 6};
  g.trans_a = true;
  gemm<double>(g, at.data(), b.data(), c.data());
  EXPECT_EQ(c, (std::vector<double>{89, 98, 116, 128}));
}

TEST(Gemm, IntegerAccumulationIsExactBeyondDoublePrecision) {
  // (2^30 + 1)(2^30 + 3) - 21 needs 61 bits: a double accumulator would round it.
  int64_t p = int64_t{1} << 30;
  std::vector<int64_t> a = {p + 1, 3}, b = {p + 3, -7}, c(1, 0);
  GemmArgs g;
  g.m = 1;
  g.n = 1;
  g.k = 2;
  gemm<int64_t>(g, a.data(), b.data(), c.data());
  EXPECT_EQ(c[0], (p + 1) * (p + 3) - 21);
  std::vector<int32_t> a3 = {40000, -3}, b3 = {50000, 7}, c3(1, 5);
  gemm<int32_t>(g, a3.data(), b3.data(), c3.data());
  EXPECT_EQ(c3[0], 2000000000 - 21);
}

TEST(Gemm, ZeroSizedDims) {
  std::vector<double> a(6, 1.0), b(6, 1.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // k = 0: the product is zeros; beta = 0 overwrites even a NaN.
  std::vector<double> c(6, nan);
  GemmArgs g;
  g.m = 2;
  g.n = 3;
  g.k = 0;
  gemm<double>(g, a.data(), b.data(), c.data());
  EXPECT_EQ(c, std::vector<double>(6, 0.0));
  // k = 0 with beta = 2 scales C.
  std::vector<double> c2 = {1, 2, 3, 4, 5, 6};
  g.beta = 2;
  gemm<double>(g, nullptr, nullptr, c2.data());
  EXPECT_EQ(c2, (std::vector<double>{2, 4, 6, 8, 10, 12}));
  // m = 0 or n = 0: nothing is touched (null pointers are fine).
  g.m = 0;
  g.k = 4;
  EXPECT_NO_THROW(gemm<double>(g, nullptr, nullptr, nullptr));
  g.m = 2;
  g.n = 0;
  EXPECT_NO_THROW(gemm<float>(g, nullptr, nullptr, nullptr));
  // Same for the naive path and k = 0.
  std::vector<f16> h(6, f16(3.0f));
  g.n = 3;
  g.k = 0;
  g.beta = 0;
  gemm<f16>(g, nullptr, nullptr, h.data());
  for (f16 e : h) EXPECT_EQ(static_cast<float>(e), 0.0f);
}

TEST(Gemm, BroadcastCAccumulatesOverBatch) {
  // stride_c = 0, beta = 1: C = sum_b A[b] * B[b].
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30}, c = {0.5};
  GemmArgs g;
  g.m = 1;
  g.n = 1;
  g.k = 1;
  g.batch = 3;
  g.stride_c = 0;
  g.beta = 1;
  gemm<double>(g, a.data(), b.data(), c.data());
  EXPECT_DOUBLE_EQ(c[0], 0.5 + 10 + 40 + 90);
}

TEST(Gemm, RejectsBadArguments) {
  GemmArgs g;
  g.m = 2;
  g.n = 3;
  g.k = 4;
  g.lda = 3;  // below k = 4
  EXPECT_THROW(resolve_gemm_args(g), Error);
  g.lda = -1;
  g.ldc = 2;  // below n = 3
  EXPECT_THROW(resolve_gemm_args(g), Error);
  g.ldc = -1;
  g.m = -1;
  EXPECT_THROW(resolve_gemm_args(g), Error);
  g.m = 2;
  std::vector<uint8_t> a(8), b(12), c(6);
  EXPECT_THROW(gemm(DType::U8, g, a.data(), b.data(), c.data()), Error);
  std::vector<int64_t> ai(8), bi(12), ci(6);
  g.alpha = 0.5;  // not a whole number for an integer gemm
  EXPECT_THROW(gemm<int64_t>(g, ai.data(), bi.data(), ci.data()), Error);
}

TEST(Gemm, TensorFormBroadcastsBatchOfOne) {
  Tensor a = Tensor::from<double>({1, 2, 2}, std::vector<double>{1, 2, 3, 4});
  Tensor b = Tensor::from<double>({2, 2, 1}, std::vector<double>{1, 1, 2, -1});
  Tensor c = gemm(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 2, 1}));
  // [1 2; 3 4] * [1; 1] = [3; 7];  [1 2; 3 4] * [2; -1] = [0; 2]
  EXPECT_EQ(c.at(0), 3);
  EXPECT_EQ(c.at(1), 7);
  EXPECT_EQ(c.at(2), 0);
  EXPECT_EQ(c.at(3), 2);
  Tensor ct = gemm(a.reshaped({2, 2}), b.reshaped({2, 2}), true, false);  // [1 3; 2 4] * [1 1; 2 -1]
  EXPECT_EQ(ct.at(0), 7);
  EXPECT_EQ(ct.at(1), -2);
  EXPECT_EQ(ct.at(2), 10);
  EXPECT_EQ(ct.at(3), -2);
  EXPECT_THROW(gemm(a.reshaped({2, 2}), Tensor::from<double>({3, 1}, std::vector<double>{1, 2, 3})), Error);
}
// A rank's pool of 2-4 threads splits an f32 / f64 GEMM into blocks of C (tensor/gemm.cc): the
// same bits as the one library call a 1-thread pool makes, for every transpose, rows and columns
// split, odd sizes, leading dims and a batch; and within rounding of the f64 reference.
template <class T>
void check_split_matches_one_call(int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t batch, double tol) {
  SCOPED_TRACE(testing::Message() << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb);
  GemmArgs g = gemm_args(ta, tb, m, n, k, 0.5);
  g.batch = batch;
  g.lda = (ta ? m : k) + 3, g.ldb = (tb ? k : n) + 1, g.ldc = n + 2;
  g.alpha = 1.5;
  const GemmArgs r = resolve_gemm_args(g);
  const std::vector<double> ad = values(r.stride_a * batch, 1), bd = values(r.stride_b * batch, 2),
                            cd = values(r.stride_c * batch, 3);
  const std::vector<T> a(ad.begin(), ad.end()), b(bd.begin(), bd.end()), c0(cd.begin(), cd.end());
  std::vector<T> whole = c0;
  {
    RankThreads one(1);
    gemm<T>(g, a.data(), b.data(), whole.data());
  }
  if (tol > 0) {  // the f64 reference (skipped on the large shapes: seconds of double loops)
    const std::vector<double> want = reference(r, ad, bd, cd);
    for (size_t i = 0; i < whole.size(); ++i)
      ASSERT_NEAR(static_cast<double>(whole[i]), want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
  }
  for (int threads : {2, 3, 4}) {
    std::vector<T> split = c0;
    RankThreads pool(threads);
    EXPECT_TRUE(gemm_split_active()) << "the default backend is OpenBLAS";
    gemm<T>(g, a.data(), b.data(), split.data());
    EXPECT_EQ(0, std::memcmp(split.data(), whole.data(), whole.size() * sizeof(T))) << "on " << threads << " threads";
  }
  EXPECT_FALSE(gemm_split_active());
}

TEST(GemmSplit, SameBitsAsOneCallOnTwoToFourThreads) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_split_matches_one_call<float>(517, 131, 259, ta, tb, 1, 1e-4);    // rows, odd sizes
      check_split_matches_one_call<float>(96, 389, 300, ta, tb, 2, 1e-4);     // columns, a batch
    }
  }
}

// The transformer step's shapes (d256 and d768 layers, 2048 tokens: forward, dX and dW): rows and
// columns split, bits against the one call only.
TEST(GemmSplit, SameBitsOnTheStepsShapes) {
  check_split_matches_one_call<float>(2048, 768, 256, false, false, 1, 0);
  check_split_matches_one_call<float>(2048, 256, 1024, false, true, 1, 0);
  check_split_matches_one_call<float>(256, 768, 2048, true, false, 1, 0);
  check_split_matches_one_call<float>(768, 3072, 2048, true, false, 1, 0);
}

// A pool's split leaves the GEMM thread settings as it found them: without a request (0: the
// library's default) the request stays 0 and OpenBLAS gets back the count it had; blas_threads()
// answers that count throughout. A request made while the pool lives is applied when it ends.
TEST(GemmSplit, EndRestoresTheThreadSettings) {
  ASSERT_EQ(blas_threads_requested(), 0) << "this test binary makes no set_blas_threads request before";
  const int library = gemm_library_threads();
  {
    RankThreads pool(2);
    EXPECT_EQ(gemm_library_threads(), 1);
    EXPECT_EQ(blas_threads(), library);
    EXPECT_EQ(blas_threads_requested(), 0);
  }
  EXPECT_EQ(blas_threads_requested(), 0) << "0 means the library's default again";
  EXPECT_EQ(gemm_library_threads(), library);
  EXPECT_EQ(blas_threads(), library);
  {
    RankThreads pool(3);
    set_blas_threads(library + 1);
    EXPECT_EQ(gemm_library_threads(), 1);
    EXPECT_EQ(blas_threads(), library + 1);
  }
  EXPECT_EQ(gemm_library_threads(), library + 1);
  EXPECT_EQ(blas_threads_requested(), library + 1);
  set_blas_threads(library);
}

}  // namespace
}  // namespace shardwise
