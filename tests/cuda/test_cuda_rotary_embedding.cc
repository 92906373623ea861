// Rotary embeddings (cuda::rotary_embedding) against ops::rotary_embedding and its backward on
// random inputs: positions [S] (i64) and per batch row [B, S] (i32), positions far from 0, odd
// sequence lengths, head dims 6, 64 and 128, f32 and bf16; and run twice, the same bits. Skipped,
// with the reason, where no GPU is present.
#include "cuda_test_util.h"

#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/ops/rotary/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaRotary = Gpu;

// f32: the same float products without contraction on both sides, cos / sin of the same float
// angle correctly rounded on both (double on the GPU): 1e-6 relative and absolute covers an ulp.
// bf16: one bf16 ulp where a float lands on a rounding boundary.
Tensor positions_of(const Shape& shape, DType dtype, int64_t start) {
  std::vector<int64_t> p(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < p.size(); ++i) p[i] = start + static_cast<int64_t>(i * 37 % 4099);
  return Tensor::from<int64_t>(shape, p).to(dtype);
}

void check_rotary(const Shape& x_shape, const Shape& pos_shape, DType pos_dtype, DType dtype) {
  const std::string what = "rotary x " + x_shape.to_string() + " positions " + pos_shape.to_string() + " " +
                           std::string(dtype_name(dtype));
  const double rtol = dtype == DType::F32 ? 1e-6 : 1e-2, atol = dtype == DType::F32 ? 1e-6 : 1e-4;
  const Tensor x = random_f32(x_shape, 61).to(dtype), dout = random_f32(x_shape, 62).to(dtype);
  const Tensor pos = positions_of(pos_shape, pos_dtype, 3);
  const double theta = 500000.0;
  const Tensor gx = to_device(x, kGpu), gpos = to_device(pos, kGpu), gdout = to_device(dout, kGpu);
  const Tensor out = cuda::rotary_embedding(gx, gpos, theta);
  const Tensor dx = cuda::rotary_embedding_backward(gdout, gpos, theta);
  expect_close(out, ops::rotary_embedding(x, pos, theta), rtol, atol, what);
  expect_close(dx, ops::rotary_embedding_backward(dout, pos, theta), rtol, atol, what + " backward");
  EXPECT_TRUE(bit_equal(out, cuda::rotary_embedding(gx, gpos, theta))) << what << ": not deterministic";
}

TEST_F(CudaRotary, ForwardAndBackwardEqualTheCpuKernel) {
  check_rotary(Shape{2, 3, 37, 64}, Shape{37}, DType::I64, DType::F32);
  check_rotary(Shape{2, 5, 33, 128}, Shape{2, 33}, DType::I32, DType::F32);
  check_rotary(Shape{7, 6}, Shape{7}, DType::I64, DType::F32);
  check_rotary(Shape{1, 2, 9, 128}, Shape{1, 9}, DType::I64, DType::BF16);
}

TEST_F(CudaRotary, AnOddHeadDimIsAnErrorNamingIt) {
  const Tensor x = to_device(random_f32(Shape{2, 4, 5}, 1), kGpu);
  const Tensor pos = to_device(positions_of(Shape{4}, DType::I64, 0), kGpu);
  try {
    cuda::rotary_embedding(x, pos, 10000.0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("D (the head dim) even"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
