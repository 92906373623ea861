// The tensor-core attention's rounding scheme (attention_mma_emulation.h: P and dS rounded to bf16
// before their products) against the CPU kernel on the GPU test's cases and tolerances
// (test_cuda_attention_mma.cc), on the CPU: that the tolerance the GPU test holds the kernels to
// admits the rounding they do; that it refuses a wrong answer (other values); and that it is
// within 10 times of that rounding's error (a tenth of it refuses some case).
#include <gtest/gtest.h>

#include "attention_mma_emulation.h"
#include "shardwise/ops/attention/kernels.h"

namespace shardwise::cuda_test {
namespace {

// The CPU kernel and the emulation on the same inputs.
struct Both {
  ops::AttentionOutputs cpu;
  ops::AttentionGrads grads;
  EmulatedAttention mma;
};
Both run_both(const AttentionInputs& in) {
  ops::AttentionArgs args;
  args.scale = in.scale;
  Both r{ops::flash_attention(in.q, in.k, in.v, in.doc, args), {}, emulate_mma_attention(in)};
  r.grads = ops::flash_attention_backward(in.q, in.k, in.v, in.doc, r.cpu.out, r.cpu.lse, in.dout, args);
  return r;
}

TEST(AttentionMmaEmulation, TheBf16RoundingOfPAndDsFitsTheGpuTestsTolerance) {
  for (const Case& c : mma_cases()) {
    const std::string what = name_of(c) + " (emulated tensor cores)";
    const Both b = run_both(attention_inputs(c));
    expect_close_to_scale(b.mma.out, b.cpu.out, what + " out");
    const CompareResult lse = compare(b.mma.lse, b.cpu.lse, 1e-4, 1e-4);
    EXPECT_TRUE(lse.equal) << what << " lse: " << lse.message;
    expect_close_to_scale(b.mma.dq, b.grads.dq, what + " dq");
    expect_close_to_scale(b.mma.dk, b.grads.dk, what + " dk");
    expect_close_to_scale(b.mma.dv, b.grads.dv, what + " dv");
  }
}

TEST(AttentionMmaEmulation, TheToleranceRefusesAWrongAnswerAndIsWithin10TimesTheRounding) {
  AttentionInputs in = attention_inputs({Shape{1, 2, 67, 64}, DType::BF16, false});
  const Tensor right = run_both(in).cpu.out;
  in.v = right;  // other values: a wrong answer
  EXPECT_FALSE(compare_to_scale(emulate_mma_attention(in).out, right).equal);
  bool all_fit_tighter = true;
  for (const Case& c : mma_cases()) {
    const Both b = run_both(attention_inputs(c));
    all_fit_tighter = all_fit_tighter && compare_to_scale(b.mma.out, b.cpu.out, 2e-3, 1e-3).equal &&
                      compare_to_scale(b.mma.dq, b.grads.dq, 2e-3, 1e-3).equal &&
                      compare_to_scale(b.mma.dk, b.grads.dk, 2e-3, 1e-3).equal &&
                      compare_to_scale(b.mma.dv, b.grads.dv, 2e-3, 1e-3).equal;
  }
  EXPECT_FALSE(all_fit_tighter) << "the tolerance is over 10 times the rounding's error: tighten it";
}

}  // namespace
}  // namespace shardwise::cuda_test
