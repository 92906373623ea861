// The fused causal attention (cuda/attention.h) against ops::flash_attention and its backward on
// random inputs: plain and grouped-query heads, odd sequence lengths that end inside a 64-row
// tile, head dims 8, 64 and 128, packed documents, f32 and bf16 (the FMA kernels: the tensor-core
// ones are test_cuda_attention_mma.cc's); and run twice, the same bits.
// Skipped, with the reason, where no GPU is present.
#include "attention_cases.h"
#include "cuda_test_util.h"

#include <cmath>

#include "shardwise/cuda/layers/attention.h"
#include "shardwise/ops/attention/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaAttention = Gpu;

// The bf16 cases force the FMA kernels (Auto would take the tensor-core ones for head dims 64 and
// 128: test_cuda_attention_mma.cc).
void check_case(const Case& c) {
  const cuda::AttentionPath path = cuda::AttentionPath::Fma;
  const std::string what = name_of(c);
  const AttentionInputs in = attention_inputs(c);
  const double scale = in.scale;
  ops::AttentionArgs args;
  args.scale = scale;
  const ops::AttentionOutputs ref = ops::flash_attention(in.q, in.k, in.v, in.doc, args);
  const ops::AttentionGrads grads =
      ops::flash_attention_backward(in.q, in.k, in.v, in.doc, ref.out, ref.lse, in.dout, args);
  const Tensor gq = to_device(in.q, kGpu), gk = to_device(in.k, kGpu), gv = to_device(in.v, kGpu);
  const Tensor gdout = to_device(in.dout, kGpu), gdoc = c.docs ? to_device(in.doc, kGpu) : Tensor();
  const cuda::AttentionResult out = cuda::flash_attention(gq, gk, gv, gdoc, scale, {}, path);
  const double rtol = rtol_of(c.dtype), atol = atol_of(c.dtype);
  expect_close(out.out, ref.out, rtol, atol, what + " out");
  expect_close(out.lse, ref.lse, 1e-5, 1e-5, what + " lse");
  const cuda::AttentionGradResult g =
      cuda::flash_attention_backward(gq, gk, gv, gdoc, out.out, out.lse, gdout, scale, {}, path);
  expect_close(g.dq, grads.dq, rtol, atol, what + " dq");
  expect_close(g.dk, grads.dk, rtol, atol, what + " dk");
  expect_close(g.dv, grads.dv, rtol, atol, what + " dv");
  const cuda::AttentionResult out2 = cuda::flash_attention(gq, gk, gv, gdoc, scale, {}, path);
  const cuda::AttentionGradResult g2 = cuda::flash_attention_backward(gq, gk, gv, gdoc, out.out, out.lse, gdout, scale, {}, path);
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
