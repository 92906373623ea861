// The elementwise kernels (cuda/elementwise.h) against their CPU kernels on random inputs with odd
// and broadcast shapes, f32 and bf16: binary ops and their gradients summed back to each operand,
// unary ops and their gradients, scale, casts, fill. Skipped without a GPU.
#include "cuda_test_util.h"

#include "shardwise/cuda/tensor_ops/elementwise.h"
#include "shardwise/cuda_ops/bind.h"
#include "shardwise/ops/activation/kernels.h"
#include "shardwise/ops/binary/kernels.h"
#include "shardwise/ops/unary/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaElementwise = Gpu;

Tensor random_of(DType t, const Shape& s, unsigned seed, float lo = -3.f, float hi = 3.f) {
  return ops::cast(random_f32(s, seed, lo, hi), t);
}
// f32: the same float operations on both sides, only sums of a broadcast gradient in another
// order (in double); bf16: one bf16 ulp (2^-8) where a float result rounds the other way.
double rtol_of(DType t) { return t == DType::BF16 ? 8e-3 : 1e-6; }

const std::pair<Shape, Shape> kBroadcasts[] = {
    {Shape{7}, Shape{7}},         {Shape{3, 1, 5}, Shape{4, 5}},     {Shape{2, 3, 17}, Shape{17}},
    {Shape{33, 1}, Shape{1, 1025}}, {Shape{1}, Shape{(1 << 20) + 3}}, {Shape{0, 3}, Shape{3}},
};

TEST_F(CudaElementwise, BinaryOpsAndTheirGradientsEqualTheCpuKernels) {
  const std::pair<cuda::Binary, ops::BinaryOp> kOps[] = {
      {cuda::Binary::Add, ops::BinaryOp::Add}, {cuda::Binary::Sub, ops::BinaryOp::Subtract},
      {cuda::Binary::Mul, ops::BinaryOp::Multiply}, {cuda::Binary::Div, ops::BinaryOp::Divide},
      {cuda::Binary::Max, ops::BinaryOp::Maximum}, {cuda::Binary::Min, ops::BinaryOp::Minimum}};
  for (DType t : {DType::F32, DType::BF16}) {
    for (const auto& [xs, ys] : kBroadcasts) {
      // Integers in [-3, 3] make ties, so maximum / minimum split gradients too.
      const Tensor x = ops::cast(ops::cast(random_f32(xs, 1), DType::I32), t), y = random_of(t, ys, 2, 0.5f, 3.f);
      const Tensor gx = to_device(x, kGpu), gy = to_device(y, kGpu);
      for (auto [gop, cop] : kOps) {
        const std::string what = std::string(ops::binary_op_name(cop)) + " " + std::string(dtype_name(t)) + " " + xs.to_string() +
                                 " " + ys.to_string();
        const Tensor out = ops::binary(cop, x, y);
        expect_close(cuda::binary(gop, gx, gy), out, 0, 0, what);
        const Tensor dout = random_of(t, out.shape(), 3);
        const ops::BinaryGrads g = ops::binary_backward(cop, x, y, out, dout);
        const cuda::BinaryGrads gg = cuda::binary_backward(gop, gx, gy, to_device(dout, kGpu));
        expect_close(gg.dx, g.dx, rtol_of(t), 1e-6, what + " dx");
        expect_close(gg.dy, g.dy, rtol_of(t), 1e-6, what + " dy");
        const cuda::BinaryGrads again = cuda::binary_backward(gop, gx, gy, to_device(dout, kGpu));
        EXPECT_TRUE(bit_equal(gg.dx, again.dx) && bit_equal(gg.dy, again.dy)) << what << ": not deterministic";
      }
    }
  }
}

// Transcendentals: CUDA's expf / logf / tanhf against the CPU's, a few ulp (1e-5 relative).
TEST_F(CudaElementwise, UnaryOpsAndTheirGradientsEqualTheCpuKernels) {
  const std::pair<cuda::Unary, ops::UnaryOp> kOps[] = {
      {cuda::Unary::Neg, ops::UnaryOp::Neg},         {cuda::Unary::Exp, ops::UnaryOp::Exp},
      {cuda::Unary::Log, ops::UnaryOp::Log},         {cuda::Unary::Sqrt, ops::UnaryOp::Sqrt},
      {cuda::Unary::Rsqrt, ops::UnaryOp::Rsqrt},     {cuda::Unary::Reciprocal, ops::UnaryOp::Reciprocal},
      {cuda::Unary::Tanh, ops::UnaryOp::Tanh},       {cuda::Unary::Sigmoid, ops::UnaryOp::Sigmoid},
      {cuda::Unary::Relu, ops::UnaryOp::Relu},       {cuda::Unary::Square, ops::UnaryOp::Square},
      {cuda::Unary::Abs, ops::UnaryOp::Abs},         {cuda::Unary::Gelu, ops::UnaryOp::Gelu},
      {cuda::Unary::Silu, ops::UnaryOp::Silu}};
  for (DType t : {DType::F32, DType::BF16}) {
    const double rtol = t == DType::BF16 ? 8e-3 : 1e-5;
    for (int64_t n : {1, 7, 1000, (1 << 20) + 3}) {
      // Positive inputs for log / sqrt / rsqrt; the others see both signs.
      for (auto [gop, cop] : kOps) {
        const bool positive = cop == ops::UnaryOp::Log || cop == ops::UnaryOp::Sqrt || cop == ops::UnaryOp::Rsqrt;
        const Tensor x = random_of(t, Shape{n}, 4, positive ? 0.1f : -3.f, 3.f), dy = random_of(t, Shape{n}, 5);
        const std::string what = std::string(ops::unary_op_name(cop)) + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n);
        const Tensor out = ops::unary(cop, x);
        const Tensor gx = to_device(x, kGpu);
        expect_close(cuda::unary(gop, gx), out, rtol, 1e-6, what);
        expect_close(cuda::unary_backward(gop, gx, to_device(out, kGpu), to_device(dy, kGpu)),
                     ops::unary_backward(cop, x, out, dy), rtol, 1e-6, what + " backward");
      }
    }
  }
}

// SwiGLU: expf against the CPU's exp in a branch-free sigmoid: a few ulp (bf16: one bf16 ulp).
TEST_F(CudaElementwise, SwigluAndItsGradientsEqualTheCpuKernels) {
  for (DType t : {DType::F32, DType::BF16}) {
    const double rtol = t == DType::BF16 ? 8e-3 : 1e-5;
    for (int64_t n : {1, 1000, (1 << 20) + 3}) {
      const std::string what = "swiglu " + std::string(dtype_name(t)) + " n=" + std::to_string(n);
      const Tensor gate = random_of(t, Shape{n}, 7, -8.f, 8.f), up = random_of(t, Shape{n}, 8), dout = random_of(t, Shape{n}, 9);
      const Tensor ggate = to_device(gate, kGpu), gup = to_device(up, kGpu);
      expect_close(cuda::swiglu(ggate, gup), ops::swiglu(gate, up), rtol, 1e-6, what);
      const ops::SwigluGrads want = ops::swiglu_backward(gate, up, dout);
      const cuda::SwigluGrads got = cuda::swiglu_backward(ggate, gup, to_device(dout, kGpu));
      expect_close(got.dgate, want.dgate, rtol, 1e-6, what + " dgate");
      expect_close(got.dup, want.dup, rtol, 1e-6, what + " dup");
    }
  }
}

TEST_F(CudaElementwise, ScaleCastAndFullEqualTheCpuBitForBit) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    const Tensor x = random_of(t, Shape{3, 1001}, 6);
    const Tensor gx = to_device(x, kGpu);
    for (bool after : {true, false}) {
      EXPECT_TRUE(bit_equal(cuda::scale(gx, 0.37, -1.25, after), ops::scale(x, 0.37, -1.25, after)))
          << "scale " << dtype_name(t) << " bias_after_scale=" << after;
    }
    for (DType to : {DType::F32, DType::BF16, DType::F16}) {
      EXPECT_TRUE(bit_equal(cuda::cast(gx, to), ops::cast(x, to))) << "cast " << dtype_name(t) << " to "
                                                                  << dtype_name(to);
    }
    const Tensor filled = cuda::full(t, Shape{5, 7}, -2.75, kGpu);
    EXPECT_TRUE(bit_equal(filled, ops::cast(Tensor::full(DType::F32, Shape{5, 7}, -2.75), t))) << "full " << dtype_name(t);
  }
  EXPECT_TRUE(bit_equal(cuda::full(DType::I64, Shape{9}, 42, kGpu),
                        Tensor::from<int64_t>(Shape{9}, std::vector<int64_t>(9, 42))));
}

// The cast op through the CUDA table (cuda_ops/elementwise.cc): `train --bf16`'s bf16 -> f32 after
// each parameter and its gradient f32 -> bf16, as the CPU op computes them.
TEST_F(CudaElementwise, TheCastOpOnCudaEqualsTheCpuOpForwardAndGradientBitForBit) {
  const auto previous = ops::install_device_kernels(DeviceKind::Cuda, cuda_ops::cuda_kernel_table());
  const ops::OpDef& op = ops::op_registry().get("cast");
  const Attrs to_f32{{"dtype", std::string("f32")}};
  const Tensor w = random_of(DType::BF16, Shape{7, 129}, 8), dy = random_f32(Shape{7, 129}, 9);
  const std::vector<Tensor> in{w}, gin{to_device(w, kGpu)};
  const std::vector<Tensor> y = ops::run_forward(op, in, to_f32), gy = ops::run_forward(op, gin, to_f32);
  EXPECT_TRUE(bit_equal(gy[0], y[0])) << "cast bf16 -> f32";
  const std::vector<Tensor> dout{dy}, gdout{to_device(dy, kGpu)};
  const std::vector<Tensor> dx = ops::run_backward(op, in, y, dout, to_f32);
  const std::vector<Tensor> gdx = ops::run_backward(op, gin, gy, gdout, to_f32);
  EXPECT_EQ(gdx[0].dtype(), DType::BF16);
  EXPECT_TRUE(bit_equal(gdx[0], dx[0])) << "its gradient f32 -> bf16";
  ops::install_device_kernels(DeviceKind::Cuda, previous);
}

TEST_F(CudaElementwise, MismatchedOperandsAreNamedErrors) {
  const Tensor x = to_device(random_f32(Shape{3, 4}, 1), kGpu);
  const Tensor y = to_device(ops::cast(random_f32(Shape{4}, 2), DType::BF16), kGpu);
  try {
    (void)cuda::binary(cuda::Binary::Add, x, y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda binary: y must be a f32 tensor"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)cuda::binary(cuda::Binary::Add, x, to_device(random_f32(Shape{5}, 3), kGpu)), Error);
  EXPECT_THROW((void)cuda::cast(to_device(Tensor::from<int64_t>(Shape{1}, {1}), kGpu), DType::F32), Error);
}

}  // namespace
}  // namespace shardwise::cuda_test
