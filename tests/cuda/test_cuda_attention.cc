// The fused causal attention (cuda/attention.h) against ops::flash_attention and its backward on
// random inputs: plain and grouped-query heads, odd sequence lengths that end inside a 64-row
// tile, head dims 8, 64 and 128, packed documents, f32 and bf16; and run twice, the same bits.
// Skipped, with the reason, where no GPU is present.
#include "cuda_test_util.h"

#include <cmath>

#include "shardwise/cuda/layers/attention.h"
#include "shardwise/ops/attention/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaAttention = Gpu;

struct Case {
  Shape q;  // [B, H, S, D] or [B, G, R, S, D]
  DType dtype;
  bool docs;
};

// f32: float on both sides, but other summation orders (the CPU's blocked GEMMs, its fast_expf
// against expf): 1e-4 relative, 2e-5 absolute. bf16: the same float arithmetic rounded to bf16 on
// both sides, so a result may land one bf16 ulp (2^-8 relative) apart: 1e-2 relative, 1e-4 absolute.
double rtol_of(DType t) { return t == DType::F32 ? 1e-4 : 1e-2; }
double atol_of(DType t) { return t == DType::F32 ? 2e-5 : 1e-4; }

Shape kv_shape(const Shape& q) {
  return q.ndim() == 4 ? q : Shape{q[0], q[1], q[3], q[4]};
}

// Document ids [B, S]: documents of 37, 50, then the rest of each row, shifted by the row.
Tensor documents(int64_t B, int64_t S) {
  std::vector<int64_t> ids(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) ids[static_cast<size_t>(b * S + s)] = (s + 5 * b) < 37 ? 0 : (s + 5 * b) < 87 ? 1 : 2;
  return Tensor::from<int64_t>(Shape{B, S}, ids);
}

std::string name_of(const Case& c) {
  return std::string("attention q ") + c.q.to_string() + " " + std::string(dtype_name(c.dtype)) + (c.docs ? " with documents" : "");
}

void check_case(const Case& c) {
  const std::string what = name_of(c);
  const Shape kv = kv_shape(c.q);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.q.back()));
  const Tensor q = random_f32(c.q, 51, -1.f, 1.f).to(c.dtype), k = random_f32(kv, 52, -1.f, 1.f).to(c.dtype),
               v = random_f32(kv, 53, -1.f, 1.f).to(c.dtype), dout = random_f32(c.q, 54, -1.f, 1.f).to(c.dtype);
  const Tensor doc = c.docs ? documents(c.q[0], kv[2]) : Tensor();
  ops::AttentionArgs args;
  args.scale = scale;
  const ops::AttentionOutputs ref = ops::flash_attention(q, k, v, doc, args);
  const ops::AttentionGrads grads = ops::flash_attention_backward(q, k, v, doc, ref.out, ref.lse, dout, args);
  const Tensor gq = to_device(q, kGpu), gk = to_device(k, kGpu), gv = to_device(v, kGpu), gdout = to_device(dout, kGpu);
  const Tensor gdoc = c.docs ? to_device(doc, kGpu) : Tensor();
  const cuda::AttentionResult out = cuda::flash_attention(gq, gk, gv, gdoc, scale);
  const double rtol = rtol_of(c.dtype), atol = atol_of(c.dtype);
  expect_close(out.out, ref.out, rtol, atol, what + " out");
  expect_close(out.lse, ref.lse, 1e-5, 1e-5, what + " lse");
  const cuda::AttentionGradResult g =
      cuda::flash_attention_backward(gq, gk, gv, gdoc, out.out, out.lse, gdout, scale);
  expect_close(g.dq, grads.dq, rtol, atol, what + " dq");
  expect_close(g.dk, grads.dk, rtol, atol, what + " dk");
  expect_close(g.dv, grads.dv, rtol, atol, what + " dv");
  const cuda::AttentionResult out2 = cuda::flash_attention(gq, gk, gv, gdoc, scale);
  const cuda::AttentionGradResult g2 = cuda::flash_attention_backward(gq, gk, gv, gdoc, out.out, out.lse, gdout, scale);
  EXPECT_TRUE(bit_equal(out.out, out2.out) && bit_equal(out.lse, out2.lse)) << what << ": forward not deterministic";
  EXPECT_TRUE(bit_equal(g.dq, g2.dq) && bit_equal(g.dk, g2.dk) && bit_equal(g.dv, g2.dv))
      << what << ": backward not deterministic";
}

TEST_F(CudaAttention, F32EqualsTheCpuKernelForwardAndBackward) {
  check_case({Shape{2, 3, 67, 64}, DType::F32, false});
  check_case({Shape{1, 2, 3, 129, 128}, DType::F32, false});  // grouped-query: 2 kv heads, 3 queries each
  check_case({Shape{2, 2, 2, 100, 64}, DType::F32, true});
  check_case({Shape{1, 1, 1, 8}, DType::F32, false});
  check_case({Shape{1, 2, 31, 24}, DType::F32, true});
}

TEST_F(CudaAttention, Bf16EqualsTheCpuKernelForwardAndBackward) {
  check_case({Shape{1, 2, 2, 100, 64}, DType::BF16, false});
  check_case({Shape{2, 2, 65, 128}, DType::BF16, true});
}

TEST_F(CudaAttention, BadInputsAreErrorsNamingTheArgument) {
  const Tensor q = to_device(random_f32(Shape{1, 2, 5, 8}, 1), kGpu);
  const Tensor k3 = to_device(random_f32(Shape{1, 3, 5, 8}, 2), kGpu);
  EXPECT_THROW(
      {
        try {
          cuda::flash_attention(q, k3, k3, Tensor(), 0.5);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("k has shape 1x3x5x8, expected 1x2x5x8"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  const Tensor big = to_device(random_f32(Shape{1, 1, 3, 130}, 3), kGpu);
  EXPECT_THROW(cuda::flash_attention(big, big, big, Tensor(), 0.1), Error);
  EXPECT_THROW(cuda::flash_attention(q, q, q, Tensor(), 0.0), Error);
}

}  // namespace
}  // namespace shardwise::cuda_test
