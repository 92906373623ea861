#pragma once
// The attention tests' cases (test_cuda_attention.cc, test_cuda_attention_mma.cc): shapes, random
// inputs and packed documents.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::cuda_test {

struct Case {
  Shape q;  // [B, H, S, D] or [B, G, R, S, D]
  DType dtype;
  bool docs;
};

// f32: float on both sides, but other summation orders (the CPU's blocked GEMMs, its fast_expf
// against expf): 1e-4 relative, 2e-5 absolute. bf16: the same float arithmetic rounded to bf16 on
// both sides, so a result may land one bf16 ulp (2^-8 relative) apart: 1e-2 relative, 1e-4 absolute.
inline double rtol_of(DType t) { return t == DType::F32 ? 1e-4 : 1e-2; }
inline double atol_of(DType t) { return t == DType::F32 ? 2e-5 : 1e-4; }

inline Shape kv_shape(const Shape& q) {
  return q.ndim() == 4 ? q : Shape{q[0], q[1], q[3], q[4]};
}

// Document ids [B, S]: documents of 37, 50, then the rest of each row, shifted by the row.
inline Tensor documents(int64_t B, int64_t S) {
  std::vector<int64_t> ids(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) ids[static_cast<size_t>(b * S + s)] = (s + 5 * b) < 37 ? 0 : (s + 5 * b) < 87 ? 1 : 2;
  return Tensor::from<int64_t>(Shape{B, S}, ids);
}

inline std::string name_of(const Case& c) {
  return std::string("attention q ") + c.q.to_string() + " " + std::string(dtype_name(c.dtype)) + (c.docs ? " with documents" : "");
}

// Random q, k, v, dout in [-1, 1] of the case's dtype, its documents (or none), scale 1 / sqrt(D).
struct AttentionInputs {
  Tensor q, k, v, dout, doc;
  double scale;
};
inline AttentionInputs attention_inputs(const Case& c) {
  const Shape kv = kv_shape(c.q);
  AttentionInputs in;
  in.q = random_f32(c.q, 51, -1.f, 1.f).to(c.dtype);
  in.k = random_f32(kv, 52, -1.f, 1.f).to(c.dtype);
  in.v = random_f32(kv, 53, -1.f, 1.f).to(c.dtype);
  in.dout = random_f32(c.q, 54, -1.f, 1.f).to(c.dtype);
  in.doc = c.docs ? documents(c.q[0], kv[2]) : Tensor();
  in.scale = 1.0 / std::sqrt(static_cast<double>(c.q.back()));
  return in;
}

// The tensor-core kernels' tolerance (test_cuda_attention_mma.cc says why), host tensors: 2e-2
// relative plus 1e-2 of the reference's largest magnitude.
inline CompareResult compare_to_scale(const Tensor& got, const Tensor& ref, double rtol = 2e-2, double frac = 1e-2) {
  const Tensor r = ref.to(DType::F32);
  float largest = 0.0f;
  for (int64_t e = 0; e < r.numel(); ++e) largest = std::max(largest, std::fabs(r.data<float>()[e]));
  return compare(got, ref, rtol, frac * largest);
}
inline void expect_close_to_scale(const Tensor& got, const Tensor& ref, const std::string& what) {
  const CompareResult c = compare_to_scale(got, ref);
  EXPECT_TRUE(c.equal) << what << ": " << c.message;
}

// The tensor-core kernels' cases: head dims 64 and 128, sequences ending inside a tile (1, 31, 65,
// 67, 100, 129), grouped-query heads, packed documents; bf16.
inline std::vector<Case> mma_cases() {
  return {{Shape{2, 3, 67, 64}, DType::BF16, false},  {Shape{1, 2, 3, 129, 128}, DType::BF16, false},
          {Shape{2, 2, 2, 100, 64}, DType::BF16, true}, {Shape{1, 1, 1, 64}, DType::BF16, false},
          {Shape{1, 2, 31, 128}, DType::BF16, true},    {Shape{1, 1, 2, 65, 64}, DType::BF16, true}};
}

}  // namespace shardwise::cuda_test
