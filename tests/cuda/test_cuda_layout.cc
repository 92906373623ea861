// The reductions and layout kernels (cuda/layout.h) against their CPU kernels: sum and mean over
// every set of dims of odd shapes (keepdim or not), a broadcast gradient summed back to an
// operand's shape, transpose, slice and its backward, concat, split, expand; f32 and bf16, sums
// run twice for the same bits. Skipped without a GPU.
#include "cuda_test_util.h"

#include "shardwise/cuda/tensor_ops/layout.h"
#include "shardwise/ops/reduction/kernels.h"
#include "shardwise/ops/shape/kernels.h"
#include "shardwise/ops/unary/kernels.h"
#include "shardwise/tensor/broadcast.h"

namespace shardwise::cuda_test {
namespace {

using CudaLayout = Gpu;

// Sums in double on both sides in another order, rounded once: 1e-6 (bf16: one ulp, 2^-8).
double rtol_of(DType t) { return t == DType::BF16 ? 8e-3 : 1e-6; }

TEST_F(CudaLayout, SumAndMeanOverEveryAxisSetEqualTheCpuKernels) {
  const Shape shapes[] = {Shape{3, 5, 7}, Shape{2, 65537, 1}, Shape{1025, 3, 2}};
  for (DType t : {DType::F32, DType::BF16}) {
    for (const Shape& s : shapes) {
      const Tensor x = ops::cast(random_f32(s, 11), t);
      const Tensor gx = to_device(x, kGpu);
      for (uint32_t mask = 1; mask < 8; ++mask) {
        for (bool keep : {false, true}) {
          const std::string what = std::string(dtype_name(t)) + " " + s.to_string() + " mask " + std::to_string(mask) +
                                   (keep ? " keepdim" : "");
          const Tensor sum = cuda::reduce_sum(gx, mask, keep);
          expect_close(sum, ops::reduce(ops::ReduceKind::Sum, x, mask, keep), rtol_of(t), 1e-5, "sum " + what);
          expect_close(cuda::reduce_mean(gx, mask, keep), ops::reduce(ops::ReduceKind::Mean, x, mask, keep),
                       rtol_of(t), 1e-6, "mean " + what);
          EXPECT_TRUE(bit_equal(sum, cuda::reduce_sum(gx, mask, keep))) << what << ": not deterministic";
        }
      }
    }
  }
}

TEST_F(CudaLayout, SumToShapeEqualsReduceToShape) {
  const Tensor g = random_f32(Shape{4, 3, 5}, 12);
  const Tensor gg = to_device(g, kGpu);
  for (const Shape& s : {Shape{3, 1}, Shape{5}, Shape{1, 1}, Shape{4, 3, 5}, Shape{1, 3, 5}, Shape{}}) {
    expect_close(cuda::sum_to_shape(gg, s), reduce_to_shape(g, s), 1e-6, 1e-6, "sum_to_shape " + s.to_string());
  }
}

TEST_F(CudaLayout, CopiesEqualTheCpuShapeKernelsBitForBit) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Tensor x = ops::cast(random_f32(Shape{3, 5, 7, 2}, 13), t);
    const Tensor gx = to_device(x, kGpu);
    const std::string dt(dtype_name(t));
    const int perm[] = {2, 0, 3, 1};
    ops::Perm p;
    p.n = 4;
    for (int j = 0; j < 4; ++j) p.to[static_cast<size_t>(j)] = static_cast<int8_t>(perm[j]);
    EXPECT_TRUE(bit_equal(cuda::transpose(gx, perm), ops::transpose(x, p))) << "transpose " << dt;

    const Attrs sl{{"axes", std::vector<int64_t>{1, 2}}, {"starts", std::vector<int64_t>{1, 2}},
                   {"ends", std::vector<int64_t>{4, 7}}};
    const int64_t starts[] = {0, 1, 2, 0}, sizes[] = {3, 3, 5, 2};
    const Tensor piece = ops::slice_local(x, x.shape(), sl);
    EXPECT_TRUE(bit_equal(cuda::slice(gx, starts, sizes), piece)) << "slice " << dt;
    EXPECT_TRUE(bit_equal(cuda::slice_backward(to_device(piece, kGpu), x.shape(), starts),
                          ops::slice_backward_local(piece, x.shape(), sl)))
        << "slice_backward " << dt;

    const Tensor parts[] = {x, ops::cast(random_f32(Shape{3, 2, 7, 2}, 14), t), ops::cast(random_f32(Shape{3, 1, 7, 2}, 15), t)};
    const Tensor gparts[] = {gx, to_device(parts[1], kGpu), to_device(parts[2], kGpu)};
    const Tensor joined = ops::concat(parts, 1);
    EXPECT_TRUE(bit_equal(cuda::concat(gparts, 1), joined)) << "concat " << dt;
    const int64_t split_sizes[] = {1, 6, 1};
    const std::vector<Tensor> want = ops::split(joined, 1, split_sizes);
    const std::vector<Tensor> got = cuda::split(to_device(joined, kGpu), 1, split_sizes);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bit_equal(got[i], want[i])) << "split piece " << i << " " << dt;

    const Tensor row = ops::cast(random_f32(Shape{5, 1, 2}, 16), t);
    EXPECT_TRUE(bit_equal(cuda::expand(to_device(row, kGpu), Shape{4, 5, 7, 2}),
                          ops::expand_local(row, row.shape(), Shape{4, 5, 7, 2})))
        << "expand " << dt;
    EXPECT_TRUE(bit_equal(cuda::copy(gx), x)) << "copy " << dt;
  }
}

TEST_F(CudaLayout, BadArgumentsAreNamedErrors) {
  const Tensor gx = to_device(random_f32(Shape{3, 4}, 1), kGpu);
  const int64_t starts[] = {2, 0}, sizes[] = {2, 4};
  try {
    (void)cuda::slice(gx, starts, sizes);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 4) of dim 0 lies outside its extent 3"), std::string::npos) << e.what();
  }
  const int bad_perm[] = {0, 0};
  EXPECT_THROW((void)cuda::transpose(gx, bad_perm), Error);
}

}  // namespace
}  // namespace shardwise::cuda_test
