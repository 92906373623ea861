// cuda::dropout against ops::dropout: the mask bit for bit on a block of a larger tensor (its
// global indices), the output and the backward bit for bit (the same float product), f32 and bf16,
// and not training. Skipped without a GPU.
#include "cuda_test_util.h"

#include "shardwise/cuda/tensor_ops/dropout.h"
#include "shardwise/ops/misc/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaDropout = Gpu;

TEST_F(CudaDropout, MaskOutputAndGradientEqualTheCpuBitForBit) {
  const Shape global{5, 33, 1027};
  const Shape block{3, 17, 1027};
  const int64_t offset[] = {2, 9, 0};
  for (DType t : {DType::F32, DType::BF16}) {
    for (bool training : {true, false}) {
      const std::string what = std::string(dtype_name(t)) + (training ? " training" : " not training");
      const Tensor x = random_f32(block, 71).to(t), dy = random_f32(block, 72).to(t);
      ops::DropoutArgs args;
      args.p = 0.1;
      args.seed = 1234567890123ull;
      args.stream = 77;
      args.training = training;
      const ops::DropoutResult want = ops::dropout(x, global, offset, args);
      const cuda::DropoutOptions o{.p = 0.1, .seed = args.seed, .stream = 77, .training = training};
      const cuda::DropoutResult got = cuda::dropout(to_device(x, kGpu), global, offset, o);
      EXPECT_TRUE(bit_equal(got.mask, want.mask)) << what << " mask";
      EXPECT_TRUE(bit_equal(got.out, want.out)) << what << " out";
      EXPECT_TRUE(bit_equal(cuda::dropout_backward(to_device(dy, kGpu), got.mask, o),
                            ops::dropout_backward(dy, want.mask, args)))
          << what << " backward";
    }
  }
}

TEST_F(CudaDropout, ABlockOutsideTheGlobalShapeIsANamedError) {
  const int64_t offset[] = {3};
  try {
    (void)cuda::dropout(to_device(random_f32(Shape{4}, 1), kGpu), Shape{6}, offset, {.seed = 1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit in the global shape"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
