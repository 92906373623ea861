// The GEMM correctness check (tensor/gemm_check.h): it passes the loaded backend and an independent
// float loop summing in another order, and fails a GEMM that drops a term, is off by one element,
// writes into C's padding or returns NaN. The step's GEMM list is checked against the PaLM FLOPs
// formula, an independent count.
#include <gtest/gtest.h>

#include <cmath>

#include "shardwise/tensor/gemm_backend.h"
#include "shardwise/tensor/gemm_check.h"

namespace {

using namespace shardwise;

// C = alpha op(A) op(B) + beta C in float, summing p from k-1 down to 0 (`terms` of them).
void reversed_float_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                         int ldb, float beta, float* c, int ldc, int terms) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int p = k - 1; p >= k - terms; --p) s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + (beta != 0 ? beta * c[i * ldc + j] : 0.0f);
    }
}

std::vector<GemmCase> small_cases() {
  auto cases = odd_gemm_cases(127);
  auto step = step_gemm_cases({2, 64, 4, 32, 257, 64});
  cases.insert(cases.end(), step.begin(), step.end());
  return cases;
}

TEST(GemmCheck, PassesTheLoadedBackendAndAnIndependentFloatLoop) {
  auto cases = small_cases();
  auto r = check_sgemm(cases, backend_sgemm);
  EXPECT_TRUE(r.ok) << r.worst_case << " " << r.worst;
  EXPECT_EQ(r.cases, static_cast<int64_t>(cases.size()));
  EXPECT_GT(r.elements, 10000);
  auto loop = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b, int ldb,
                 float be, float* c, int ldc) { reversed_float_gemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc, k); };
  auto r2 = check_sgemm(cases, loop);
  EXPECT_TRUE(r2.ok) << r2.worst_case << " " << r2.worst;
  EXPECT_LE(r2.worst, 1.0);
}

TEST(GemmCheck, FailsAWrongGemm) {
  auto cases = small_cases();
  auto drop_last_term = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b,
                           int ldb, float be, float* c, int ldc) {
    reversed_float_gemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc, k > 1 ? k - 1 : k);
  };
  auto r = check_sgemm(cases, drop_last_term);
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.worst, 1.0);
  EXPECT_NE(r.worst_case.find("x3"), std::string::npos) << r.worst_case;  // the first case with k > 1: ..x3
  // One element of the last row / column off by a relative 1e-4 (far above (k+2) 2^-24 for k <= 1025).
  auto one_off = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b, int ldb,
                    float be, float* c, int ldc) {
    backend_sgemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    if (m == 127 && n == 127 && k == 127) c[126 * ldc + 126] *= 1.0001f;
  };
  EXPECT_FALSE(check_sgemm(cases, one_off).ok);
  auto pad_writer = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b, int ldb,
                       float be, float* c, int ldc) {
    backend_sgemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    if (ldc > n) c[n] = 0;  // the padding after row 0
  };
  auto rp = check_sgemm(cases, pad_writer);
  EXPECT_FALSE(rp.ok);
  EXPECT_NE(rp.worst_case.find("padded"), std::string::npos) << rp.worst_case;
  auto nan = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b, int ldb,
                float be, float* c, int ldc) {
    backend_sgemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    c[0] = std::nanf("");
  };
  EXPECT_FALSE(check_sgemm(cases, nan).ok);
}

TEST(GemmCheck, StepCasesCoverEveryTransposeAndTheStepsFlops) {
  StepShape s;  // GPT-2 small, micro-batch 4 x 512 tokens
  double flops = 0;
  bool nn = false, nt = false, tn = false;
  for (const auto& c : step_gemm_cases(s)) {
    flops += c.count * gemm_flops(c);
    nn |= !c.ta && !c.tb, nt |= !c.ta && c.tb, tn |= c.ta && !c.tb;
  }
  EXPECT_TRUE(nn && nt && tn);
  // PaLM's count: 6 x matmul parameters (12 L H^2 + V H) per token + 12 L S H per token.
  const double L = 12, H = 768, V = 50257, S = 512, N = 2048;
  EXPECT_DOUBLE_EQ(flops, N * (6 * (12 * L * H * H + V * H) + 12 * L * S * H));
  // Fewer tokens than one sequence (the measurement's reduced rows) still runs attention on one.
  for (const auto& c : step_gemm_cases({12, 768, 12, 512, 50257, 256})) EXPECT_GT(gemm_flops(c), 0) << c.what;
}

TEST(GemmBackend, RefusesAnUnknownNameOrASecondBackend) {
  gemm_backend();  // loads "openblas": the process's backend is now fixed
  try {
    load_gemm_backend("mkl");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("unknown gemm backend 'mkl'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("openblas-skylakex"), std::string::npos) << e.what();
  }
  EXPECT_EQ(load_gemm_backend("openblas").name, "openblas");  // the same one again is fine
  try {
    load_gemm_backend("blis");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("already runs openblas"), std::string::npos) << e.what();
  }
}

}  // namespace
