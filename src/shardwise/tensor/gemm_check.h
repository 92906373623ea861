#pragma once
// The correctness check and the measurement behind the GEMM backend choice (tensor/gemm_backend.h,
// `shardwise gemm-check`).
//
// Check: every f32 GEMM a transformer training step runs (linear layers, LM head, attention;
// NN, NT, TN; batched; strided operands) and odd sizes (1, 3, 17, 127, 1025: none a multiple of a
// kernel tile), each against a float64 reference on sampled elements (the first, middle and last
// rows / columns plus random ones). Tolerance: any order of float32 sums (blocked, FMA) of a
// k-term dot product, scaled by alpha and plus beta * C, is within gamma_{k+2} = (k+2)u / (1-(k+2)u)
// of the exact value, relative to sum |alpha a_ip b_pj| + |beta c_ij| (Higham, Accuracy and
// Stability of Numerical Algorithms, 3.1; u = 2^-24); the f64 reference's own error is ~2^-53 k.
// A correct GEMM always passes; a wrong kernel is off by O(1). Also fails: a non-finite result
// and any write into C's row padding.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shardwise {

struct GemmCase {
  std::string what;   // "mlp.fc dW", "attn scores", "odd 17x1025x3"
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  int64_t pad = 0;    // extra elements per row of A, B and C (strided operands)
  float beta = 0;
  double count = 1;   // calls per training step (the measurement's weight)
};

// The GEMMs of one GPT training step (forward and backward), `tokens` = micro-batch x seq rows.
struct StepShape {
  int64_t layers = 12, hidden = 768, heads = 12, seq = 512, vocab = 50257, tokens = 2048;
};
std::vector<GemmCase> step_gemm_cases(const StepShape& s);
// Odd sizes in every transpose the step uses, with and without padding and beta = 1.
std::vector<GemmCase> odd_gemm_cases(int64_t max_size = 1025);

using SgemmFn = std::function<void(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                                   const float* b, int ldb, float beta, float* c, int ldc)>;

struct GemmCheckResult {
  bool ok = true;
  int64_t cases = 0, elements = 0;  // checked
  double worst = 0;                 // largest error / tolerance (<= 1 passes)
  std::string worst_case;           // the case of `worst`, or the first failure
};
GemmCheckResult check_sgemm(const std::vector<GemmCase>& cases, const SgemmFn& fn, uint64_t seed = 1);

// Seconds of the fastest of `reps` runs of the case (after one warm-up run).
double time_sgemm(const GemmCase& c, const SgemmFn& fn, int reps);
inline double gemm_flops(const GemmCase& c) {
  return 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) *
         static_cast<double>(c.batch);
}

}  // namespace shardwise
