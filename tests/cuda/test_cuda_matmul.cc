// cuda::matmul / matmul_backward (cuBLASLt) against ops::matmul_forward / matmul_grads on random
// inputs: every form of the op (transposes, 1-D operands, a batch folded into m, batch dims
// broadcast to a strided batch or to one GEMM per item, k = 0), f32 and bf16, TF32 only when asked;
// each run twice for the same bits, and the heuristic asked once per shape. Skipped without a GPU.
#include "cuda_test_util.h"

#include "shardwise/cuda/gemm/blas.h"
#include "shardwise/cuda/gemm/matmul.h"
#include "shardwise/ops/matmul/kernels.h"
#include "shardwise/ops/unary/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaMatmul = Gpu;

struct Case {
  Shape x, y;
  bool tx = false, ty = false;
};
const Case kCases[] = {
    {Shape{3, 7, 33}, Shape{33, 65}},             // a linear layer: batch folded into m
    {Shape{33, 5}, Shape{33, 17}, true, false},   // x stored transposed
    {Shape{2, 5, 33}, Shape{17, 33}, false, true},  // a linear layer with the weight [out, in]
    {Shape{4, 33, 5}, Shape{4, 17, 33}, true, true},
    {Shape{2, 3, 9, 16}, Shape{2, 3, 16, 11}},    // attention scores / values: a strided batch
    {Shape{2, 3, 9, 16}, Shape{2, 3, 11, 16}, false, true},
    {Shape{5, 7}, Shape{4, 7, 6}},                // x one matrix for every item: stride 0, dx summed
    {Shape{2, 1, 5, 7}, Shape{3, 7, 4}},          // a broadcast neither whole nor single: per item
    {Shape{7}, Shape{7}},                         // vectors
    {Shape{7}, Shape{3, 7, 5}},
    {Shape{3, 5, 7}, Shape{7}},
    {Shape{3, 0}, Shape{0, 4}},                   // k = 0: zeros
    {Shape{1, 257, 129}, Shape{129, 255}},
};

Attrs attrs_of(const Case& c) { return Attrs{{"trans_x", c.tx}, {"trans_y", c.ty}}; }
std::string name_of(const Case& c, DType t) {
  return std::string(dtype_name(t)) + " " + c.x.to_string() + (c.tx ? "^T" : "") + " x " + c.y.to_string() +
         (c.ty ? "^T" : "");
}

// Inputs in [-1, 1]: f32 sums of up to 257 products in another order differ by about k ulp of
// the sum (atol 1e-4); bf16 rounds the output once, from a sum in another order (half an ulp of
// bf16, 2^-9 relative, either way).
void check_case(const Case& c, DType t, unsigned seed, double rtol, double atol) {
  const std::string what = name_of(c, t);
  const Tensor x = ops::cast(random_f32(c.x, seed, -1.f, 1.f), t), y = ops::cast(random_f32(c.y, seed + 1, -1.f, 1.f), t);
  const Tensor in[2] = {x, y};
  const Tensor ref = ops::matmul_forward(in, attrs_of(c))[0];
  const Tensor dout = ops::cast(random_f32(ref.shape(), seed + 2, -1.f, 1.f), t);
  const Tensor douts[1] = {dout};
  const std::vector<Tensor> grads = ops::matmul_grads(in, douts, attrs_of(c), true, true);
  const cuda::MatmulOptions o{.trans_x = c.tx, .trans_y = c.ty};
  const Tensor gx = to_device(x, kGpu), gy = to_device(y, kGpu), gdout = to_device(dout, kGpu);
  const Tensor out = cuda::matmul(gx, gy, o);
  ASSERT_EQ(out.dtype(), ref.dtype()) << what;
  expect_close(out, ref, rtol, atol, what);
  const cuda::MatmulGrads g = cuda::matmul_backward(gx, gy, gdout, o);
  expect_close(g.dx, grads[0], rtol, atol, what + " dx");
  expect_close(g.dy, grads[1], rtol, atol, what + " dy");
  const cuda::MatmulGrads again = cuda::matmul_backward(gx, gy, gdout, o);
  EXPECT_TRUE(bit_equal(out, cuda::matmul(gx, gy, o)) && bit_equal(g.dx, again.dx) && bit_equal(g.dy, again.dy))
      << what << ": not deterministic";
}

TEST_F(CudaMatmul, F32EqualsTheCpuMatmulInEveryForm) {
  unsigned seed = 1;
  for (const Case& c : kCases) check_case(c, DType::F32, seed += 3, 1e-5, 1e-4);
}

TEST_F(CudaMatmul, Bf16AccumulatesInF32AndWritesBf16) {
  unsigned seed = 100;
  for (const Case& c : kCases) check_case(c, DType::BF16, seed += 3, 8e-3, 8e-3);
}

// TF32 keeps 10 bits of mantissa: close to f32 (5e-3), and only when asked.
TEST_F(CudaMatmul, Tf32IsAnExplicitOption) {
  const Tensor x = random_f32(Shape{64, 256}, 7, -1.f, 1.f), y = random_f32(Shape{256, 96}, 8, -1.f, 1.f);
  const Tensor in[2] = {x, y};
  const Tensor ref = ops::matmul_forward(in, Attrs{})[0];
  const Tensor gx = to_device(x, kGpu), gy = to_device(y, kGpu);
  expect_close(cuda::matmul(gx, gy, {.tf32 = true}), ref, 5e-3, 5e-2, "tf32");
  expect_close(cuda::matmul(gx, gy), ref, 1e-5, 1e-4, "f32 (tf32 off by default)");
}

TEST_F(CudaMatmul, TheHeuristicIsAskedOncePerShape) {
  const Tensor gx = to_device(random_f32(Shape{37, 41}, 9), kGpu), gy = to_device(random_f32(Shape{41, 43}, 10), kGpu);
  (void)cuda::matmul(gx, gy);
  const cuda::BlasStats before = cuda::blas_stats();
  for (int i = 0; i < 3; ++i) (void)cuda::matmul(gx, gy);
  const cuda::BlasStats after = cuda::blas_stats();
  EXPECT_EQ(after.heuristic_queries, before.heuristic_queries);
  EXPECT_EQ(after.gemms, before.gemms + 3);
}

TEST_F(CudaMatmul, MismatchedOperandsAreNamedErrors) {
  const Tensor gx = to_device(random_f32(Shape{3, 4}, 1), kGpu), gy = to_device(random_f32(Shape{5, 6}, 2), kGpu);
  try {
    (void)cuda::matmul(gx, gy);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on the contracted dim: 4 vs 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)cuda::matmul(gx, random_f32(Shape{4, 2}, 3)), Error);  // y on the host
}

}  // namespace
}  // namespace shardwise::cuda_test
