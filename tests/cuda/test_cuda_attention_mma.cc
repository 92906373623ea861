// The tensor-core attention (bf16, head dims 64 and 128: cuda/layers/attention_mma_*.cu) against
// the CPU kernel on the same bf16 inputs and against the FMA kernel on the GPU, forward (out, lse)
// and backward (dq, dk, dv): plain and grouped-query heads, packed documents, sequences of 1, 31,
// 65, 100 and 129 (ending inside a 64-row tile); run twice, the same bits; Auto takes it for these
// shapes and the FMA kernel for other head dims. Skipped, with the reason, where no GPU is present.
//
// Tolerance (never measured: no GPU has run this yet): the tensor cores multiply P and dS rounded
// to bf16 (the FMA kernel keeps them f32), a relative error of up to 2^-9 per term, and every
// output is rounded to bf16 (2^-9 again). Errors are judged against the size of the result: 2e-2
// relative plus 1e-2 of the reference's largest magnitude; lse (f32 scores from exact bf16
// products, f32 sums) 1e-4. test_cuda_attention_mma_emulation.cc checks on the CPU that this
// rounding scheme fits those tolerances on these cases.
#include "attention_cases.h"
#include "cuda_test_util.h"
#include "shardwise/cuda/layers/attention.h"
#include "shardwise/ops/attention/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaAttentionMma = Gpu;
using cuda::AttentionPath;

struct Run {
  cuda::AttentionResult out;
  cuda::AttentionGradResult grads;
};

Run run_on_gpu(const AttentionInputs& in, AttentionPath path) {
  const Tensor gq = to_device(in.q, kGpu), gk = to_device(in.k, kGpu), gv = to_device(in.v, kGpu);
  const Tensor gdout = to_device(in.dout, kGpu), gdoc = in.doc.defined() ? to_device(in.doc, kGpu) : Tensor();
  Run r{cuda::flash_attention(gq, gk, gv, gdoc, in.scale, {}, path), {}};
  r.grads = cuda::flash_attention_backward(gq, gk, gv, gdoc, r.out.out, r.out.lse, gdout, in.scale, {}, path);
  return r;
}

void expect_run_close(const Run& got, const Run& ref, const std::string& what) {
  expect_close_to_scale(to_host(got.out.out), to_host(ref.out.out), what + " out");
  expect_close(got.out.lse, to_host(ref.out.lse), 1e-4, 1e-4, what + " lse");
  expect_close_to_scale(to_host(got.grads.dq), to_host(ref.grads.dq), what + " dq");
  expect_close_to_scale(to_host(got.grads.dk), to_host(ref.grads.dk), what + " dk");
  expect_close_to_scale(to_host(got.grads.dv), to_host(ref.grads.dv), what + " dv");
}

bool bit_equal_runs(const Run& a, const Run& b) {
  return bit_equal(a.out.out, b.out.out) && bit_equal(a.out.lse, b.out.lse) && bit_equal(a.grads.dq, b.grads.dq) &&
         bit_equal(a.grads.dk, b.grads.dk) && bit_equal(a.grads.dv, b.grads.dv);
}

void check_mma_case(const Case& c) {
  const std::string what = name_of(c) + " (tensor cores)";
  const AttentionInputs in = attention_inputs(c);
  ops::AttentionArgs args;
  args.scale = in.scale;
  const ops::AttentionOutputs cpu = ops::flash_attention(in.q, in.k, in.v, in.doc, args);
  const ops::AttentionGrads cpu_g =
      ops::flash_attention_backward(in.q, in.k, in.v, in.doc, cpu.out, cpu.lse, in.dout, args);
  const Run mma = run_on_gpu(in, AttentionPath::TensorCore);
  // Against the CPU: the CPU's backward from its own out and lse, the GPU's from its own.
  expect_close_to_scale(to_host(mma.out.out), cpu.out, what + " out vs the CPU");
  expect_close(mma.out.lse, cpu.lse, 1e-4, 1e-4, what + " lse vs the CPU");
  expect_close_to_scale(to_host(mma.grads.dq), cpu_g.dq, what + " dq vs the CPU");
  expect_close_to_scale(to_host(mma.grads.dk), cpu_g.dk, what + " dk vs the CPU");
  expect_close_to_scale(to_host(mma.grads.dv), cpu_g.dv, what + " dv vs the CPU");
  expect_run_close(mma, run_on_gpu(in, AttentionPath::Fma), what + " vs the FMA kernel");
  EXPECT_TRUE(bit_equal_runs(mma, run_on_gpu(in, AttentionPath::TensorCore))) << what << ": not deterministic";
  EXPECT_TRUE(bit_equal_runs(mma, run_on_gpu(in, AttentionPath::Auto))) << what << ": Auto did not take it";
}

TEST_F(CudaAttentionMma, Bf16HeadDims64And128EqualTheCpuAndTheFmaKernel) {
  for (const Case& c : mma_cases()) check_mma_case(c);
}

TEST_F(CudaAttentionMma, OtherHeadDimsAndF32TakeTheFmaKernel) {
  for (const Case& c : {Case{Shape{1, 2, 31, 24}, DType::BF16, false}, Case{Shape{1, 2, 65, 64}, DType::F32, false}}) {
    const AttentionInputs in = attention_inputs(c);
    EXPECT_TRUE(bit_equal_runs(run_on_gpu(in, AttentionPath::Auto), run_on_gpu(in, AttentionPath::Fma))) << name_of(c);
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
