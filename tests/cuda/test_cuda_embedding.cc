// Embedding (cuda::embedding) against ops::embedding and its backward: repeated ids (a padding id
// on a third of the positions), i64 and i32 ids, a vocab-parallel block with ids outside it, odd
// hidden sizes, f32 and bf16 weights. The gradient adds duplicates in the CPU's order (bf16: in f32,
// rounded once), so both are compared bit for bit; and run twice, the same bits. Skipped, with the reason, where no GPU is present.
#include "cuda_test_util.h"

#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/ops/index/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaEmbedding = Gpu;

Tensor ids_of(const Shape& shape, int64_t vocab, DType dtype) {
  std::vector<int64_t> ids(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 3 == 1 ? 3 : static_cast<int64_t>(i * 7919 % vocab);
  return Tensor::from<int64_t>(shape, ids).to(dtype);
}

void check_embedding(const Shape& ids_shape, DType ids_dtype, int64_t vocab, int64_t offset, int64_t rows,
                     int64_t hidden, DType dtype) {
  const std::string what = "embedding ids " + ids_shape.to_string() + " block [" + std::to_string(offset) + ", " +
                           std::to_string(offset + rows) + ") of " + std::to_string(vocab) + " x " +
                           std::to_string(hidden) + " " + std::string(dtype_name(dtype));
  const Tensor ids = ids_of(ids_shape, vocab, ids_dtype), weight = random_f32(Shape{rows, hidden}, 71).to(dtype);
  const Tensor gids = to_device(ids, kGpu);
  expect_close(cuda::embedding(gids, to_device(weight, kGpu), offset, vocab), ops::embedding(ids, weight, offset, vocab),
               0, 0, what);
  Shape out_shape = ids_shape;
  out_shape.push_back(hidden);
  const Tensor dout = random_f32(out_shape, 72).to(dtype), gdout = to_device(dout, kGpu);
  const Tensor dw = cuda::embedding_backward(gids, gdout, weight.shape(), offset, vocab);
  ASSERT_EQ(dw.dtype(), dtype) << what;
  // bf16: the CPU's f32 gradient of the same (exactly widened) dout, rounded once; the CPU's own bf16
  // gradient rounds after every add instead.
  const Tensor ref = ops::embedding_backward(ids, dout.to(DType::F32), weight.shape(), offset, vocab).to(dtype);
  EXPECT_TRUE(bit_equal(dw, ref)) << what << " dweight";
  EXPECT_TRUE(bit_equal(dw, cuda::embedding_backward(gids, gdout, weight.shape(), offset, vocab)))
      << what << ": not deterministic";
}

TEST_F(CudaEmbedding, ForwardAndGradientEqualTheCpuKernelBitForBit) {
  check_embedding(Shape{3, 17}, DType::I64, 50, 0, 50, 33, DType::F32);
  check_embedding(Shape{2000}, DType::I32, 1000, 0, 1000, 257, DType::F32);
  check_embedding(Shape{4, 129}, DType::I64, 50257, 0, 50257, 64, DType::F32);
  check_embedding(Shape{5, 31}, DType::I64, 50, 20, 25, 7, DType::F32);  // vocab-parallel: ids outside the block
  check_embedding(Shape{5, 31}, DType::I64, 50, 0, 50, 130, DType::BF16);
  check_embedding(Shape{2000}, DType::I32, 1000, 0, 1000, 257, DType::BF16);  // runs of repeated ids
  check_embedding(Shape{5, 31}, DType::I64, 50, 20, 25, 7, DType::BF16);
  check_embedding(Shape{1}, DType::I64, 1, 0, 1, 1, DType::F32);
}

TEST_F(CudaEmbedding, AnIdOutOfRangeIsAnErrorNamingItsPosition) {
  const Tensor weight = to_device(random_f32(Shape{10, 4}, 1), kGpu);
  const Tensor ids = to_device(Tensor::from<int64_t>(Shape{5}, std::vector<int64_t>{1, 2, 10, 3, -1}), kGpu);
  try {
    cuda::embedding(ids, weight, 0, 10);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 10 at position 2 is out of range"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
