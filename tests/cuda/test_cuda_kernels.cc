// Every CUDA kernel (cuda/kernels.h) against its CPU kernel on random inputs, odd sizes included,
// forward and gradient, with the tolerance stated per kernel; and run twice, the same bits. Skipped,
// with the reason, where no GPU is present: on the machines `make test` runs on these never run
// (docs/gpu.md says which have run on a GPU).
#include "cuda_test_util.h"

#include <cmath>

#include "shardwise/cuda/layers/kernels.h"
#include "shardwise/ops/norm/kernels.h"
#include "shardwise/ops/softmax/kernels.h"
#include "shardwise/ops/unary/kernels.h"

namespace shardwise::cuda_test {
namespace {

using CudaKernels = Gpu;

// GELU / SiLU: float on both sides, tanhf / expf against the CPU's vectorised tanh: a few ulp.
constexpr double kActRtol = 1e-5, kActAtol = 1e-6;

TEST_F(CudaKernels, ActivationsEqualTheCpuKernels) {
  for (auto [gpu_op, cpu_op] : {std::pair{cuda::Activation::Gelu, ops::UnaryOp::Gelu},
                                std::pair{cuda::Activation::Silu, ops::UnaryOp::Silu}}) {
    for (int64_t n : {1, 7, 1000, (1 << 20) + 3}) {
      const std::string what = std::string(ops::unary_op_name(cpu_op)) + " n=" + std::to_string(n);
      const Tensor x = random_f32(Shape{n}, 11, -6.f, 6.f), dy = random_f32(Shape{n}, 12);
      const Tensor out = ops::unary(cpu_op, x);
      const Tensor dx = ops::unary_backward(cpu_op, x, out, dy);
      const Tensor gx = to_device(x, kGpu), gdy = to_device(dy, kGpu);
      expect_close(cuda::activation(gpu_op, gx), out, kActRtol, kActAtol, what);
      expect_close(cuda::activation_backward(gpu_op, gx, gdy), dx, kActRtol, kActAtol, what + " backward");
    }
  }
}

// AdamW: train::AdamW::update's float formula, written out here (the train layer is too far up
// for this binary); FMA contraction on the GPU: 1e-6 relative.
void adamw_reference(Tensor& w, Tensor& m, Tensor& v, const Tensor& g, double lr, int64_t step) {
  const double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1;
  const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, static_cast<double>(step))));
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  const float decay = static_cast<float>(1.0 - lr * wd);
  float *pw = w.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
  const float* pg = g.data<float>();
  for (int64_t j = 0; j < w.numel(); ++j) {
    pm[j] = b1 * pm[j] + (1.0f - b1) * pg[j];
    pv[j] = b2 * pv[j] + (1.0f - b2) * pg[j] * pg[j];
    pw[j] = pw[j] * decay - step_size * pm[j] / (std::sqrt(pv[j]) * inv_bc2_sqrt + static_cast<float>(eps));
  }
}

TEST_F(CudaKernels, AdamWEqualsTheCpuUpdateOverThreeSteps) {
  const int64_t n = 100003;
  Tensor w = random_f32(Shape{n}, 1), m = Tensor(DType::F32, Shape{n}), v = Tensor(DType::F32, Shape{n});
  Tensor gw = to_device(w, kGpu), gm = to_device(m, kGpu), gv = to_device(v, kGpu);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor g = random_f32(Shape{n}, static_cast<unsigned>(100 + step), -0.1f, 0.1f);
    adamw_reference(w, m, v, g, 3e-4, step);
    cuda::adamw_update(gw, gm, gv, to_device(g, kGpu), {.lr = 3e-4, .step = step, .decay = true});
  }
  expect_close(gw, w, 1e-6, 1e-7, "adamw w");
  expect_close(gm, m, 1e-6, 1e-9, "adamw m");
  expect_close(gv, v, 1e-6, 1e-12, "adamw v");
}

// A bf16 parameter with an f32 master: the same update, and the parameter is the master rounded
// to bf16 (train::AdamW::step's p.master.to(bf16)), bit for bit.
TEST_F(CudaKernels, AdamWWritesTheBf16CopyOfItsF32Master) {
  const int64_t n = 4099;
  Tensor w = random_f32(Shape{n}, 2), m = Tensor(DType::F32, Shape{n}), v = Tensor(DType::F32, Shape{n});
  Tensor gw = to_device(w, kGpu), gm = to_device(m, kGpu), gv = to_device(v, kGpu);
  Tensor param = zeros_on(DType::BF16, Shape{n}, kGpu);
  const Tensor g = random_f32(Shape{n}, 3, -0.1f, 0.1f);
  adamw_reference(w, m, v, g, 1e-3, 1);
  cuda::adamw_update(gw, gm, gv, to_device(g, kGpu), {.lr = 1e-3, .step = 1}, {}, &param);
  expect_close(gw, w, 1e-6, 1e-7, "adamw w");
  EXPECT_TRUE(bit_equal(param, to_host(gw).to(DType::BF16)));
}

// Norms: each row in double on both sides, rounded once to float; only the order of the double
// sums differs: 1e-6 relative (atol 1e-6 for dx and the parameter sums, which cancel).
constexpr double kNormRtol = 1e-6, kNormAtol = 1e-6;
const std::pair<int64_t, int64_t> kNormSizes[] = {{1, 1}, {3, 5}, {17, 1023}, {64, 4097}, {2, 65537}};

TEST_F(CudaKernels, LayerNormForwardAndBackwardEqualTheCpuKernels) {
  for (auto [rows, cols] : kNormSizes) {
    const std::string what = "layer_norm " + std::to_string(rows) + "x" + std::to_string(cols);
    const Tensor x = random_f32(Shape{rows, cols}, 21), scale = random_f32(Shape{cols}, 22),
                 bias = random_f32(Shape{cols}, 23), dout = random_f32(Shape{rows, cols}, 24);
    const ops::LayerNormOutputs ref = ops::layer_norm(x, scale, bias, -1, 1e-5);
    const ops::LayerNormGrads grads = ops::layer_norm_backward(x, scale, ref.mean, ref.rstd, dout, -1);
    const Tensor gx = to_device(x, kGpu), gscale = to_device(scale, kGpu);
    const cuda::LayerNormResult out = cuda::layer_norm(gx, gscale, to_device(bias, kGpu), 1e-5);
    expect_close(out.out, ref.out, kNormRtol, kNormAtol, what);
    expect_close(out.mean.reshaped(ref.mean.shape()), ref.mean, kNormRtol, kNormAtol, what + " mean");
    expect_close(out.rstd.reshaped(ref.rstd.shape()), ref.rstd, kNormRtol, kNormAtol, what + " rstd");
    const Tensor gdout = to_device(dout, kGpu);
    const cuda::LayerNormGradResult g = cuda::layer_norm_backward(gx, gscale, out.mean, out.rstd, gdout);
    expect_close(g.dx, grads.dx, kNormRtol, kNormAtol, what + " dx");
    expect_close(g.dscale, grads.dscale, kNormRtol, kNormAtol, what + " dscale");
    expect_close(g.dbias, grads.dbias, kNormRtol, kNormAtol, what + " dbias");
    const cuda::LayerNormGradResult again = cuda::layer_norm_backward(gx, gscale, out.mean, out.rstd, gdout);
    EXPECT_TRUE(bit_equal(g.dx, again.dx) && bit_equal(g.dscale, again.dscale)) << what << ": not deterministic";
  }
}

TEST_F(CudaKernels, RmsNormForwardAndBackwardEqualTheCpuKernels) {
  for (auto [rows, cols] : kNormSizes) {
    const std::string what = "rms_norm " + std::to_string(rows) + "x" + std::to_string(cols);
    const Tensor x = random_f32(Shape{rows, cols}, 31), scale = random_f32(Shape{cols}, 32),
                 dout = random_f32(Shape{rows, cols}, 33);
    const ops::RmsNormOutputs ref = ops::rms_norm(x, scale, -1, 1e-6);
    const ops::RmsNormGrads grads = ops::rms_norm_backward(x, scale, ref.inv_rms, dout, -1);
    const Tensor gx = to_device(x, kGpu), gscale = to_device(scale, kGpu);
    const cuda::RmsNormResult out = cuda::rms_norm(gx, gscale, 1e-6);
    expect_close(out.out, ref.out, kNormRtol, kNormAtol, what);
    expect_close(out.inv_rms.reshaped(ref.inv_rms.shape()), ref.inv_rms, kNormRtol, kNormAtol, what + " inv_rms");
    const cuda::RmsNormGradResult g = cuda::rms_norm_backward(gx, gscale, out.inv_rms, to_device(dout, kGpu));
    expect_close(g.dx, grads.dx, kNormRtol, kNormAtol, what + " dx");
    expect_close(g.dscale, grads.dscale, kNormRtol, kNormAtol, what + " dscale");
  }
}

// bf16 x and parameters (f32 statistics): the same double rows, rounded once to bf16 on the CPU and
// through float on the GPU: one bf16 ulp (2^-8).
TEST_F(CudaKernels, Bf16NormsEqualTheCpuKernels) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 5}, {17, 1023}, {2, 4097}}) {
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    const Tensor x = random_f32(Shape{rows, cols}, 61).to(DType::BF16), scale = random_f32(Shape{cols}, 62).to(DType::BF16),
                 bias = random_f32(Shape{cols}, 63).to(DType::BF16), dout = random_f32(Shape{rows, cols}, 64).to(DType::BF16);
    const Tensor gx = to_device(x, kGpu), gscale = to_device(scale, kGpu), gdout = to_device(dout, kGpu);
    const ops::LayerNormOutputs ln = ops::layer_norm(x, scale, bias, -1, 1e-5);
    const ops::LayerNormGrads lg = ops::layer_norm_backward(x, scale, ln.mean, ln.rstd, dout, -1);
    const cuda::LayerNormResult gln = cuda::layer_norm(gx, gscale, to_device(bias, kGpu), 1e-5);
    expect_close(gln.out, ln.out, 8e-3, 1e-6, "bf16 layer_norm " + what);
    const cuda::LayerNormGradResult glg = cuda::layer_norm_backward(gx, gscale, gln.mean, gln.rstd, gdout);
    expect_close(glg.dx, lg.dx, 8e-3, 1e-5, "bf16 layer_norm dx " + what);
    expect_close(glg.dscale, lg.dscale, 8e-3, 1e-5, "bf16 layer_norm dscale " + what);
    expect_close(glg.dbias, lg.dbias, 8e-3, 1e-5, "bf16 layer_norm dbias " + what);
    const ops::RmsNormOutputs rn = ops::rms_norm(x, scale, -1, 1e-6);
    const ops::RmsNormGrads rg = ops::rms_norm_backward(x, scale, rn.inv_rms, dout, -1);
    const cuda::RmsNormResult grn = cuda::rms_norm(gx, gscale, 1e-6);
    expect_close(grn.out, rn.out, 8e-3, 1e-6, "bf16 rms_norm " + what);
    const cuda::RmsNormGradResult grg = cuda::rms_norm_backward(gx, gscale, grn.inv_rms, gdout);
    expect_close(grg.dx, rg.dx, 8e-3, 1e-5, "bf16 rms_norm dx " + what);
    expect_close(grg.dscale, rg.dscale, 8e-3, 1e-5, "bf16 rms_norm dscale " + what);
  }
}

// Random rows in [-20, 20] with a causal mask's -1e9 entries (every other column past the row's index).
Tensor masked_rows(int64_t rows, int64_t cols, unsigned seed) {
  Tensor x = random_f32(Shape{rows, cols}, seed, -20.f, 20.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r + 1; c < cols; c += 2) x.data<float>()[r * cols + c] = -1e9f;
  return x;
}

// Softmax: float exponentials on both sides (expf against the CPU's fast_expf, a few ulp each),
// sums in double: 2e-6 relative. The backward from the CPU's output on both sides: only the
// double sums' order differs: 1e-6 relative. Rows with a causal mask's -1e9 entries too.
TEST_F(CudaKernels, SoftmaxForwardAndBackwardEqualTheCpuKernels) {
  for (auto [rows, cols] : kNormSizes) {
    const std::string what = "softmax " + std::to_string(rows) + "x" + std::to_string(cols);
    const Tensor x = masked_rows(rows, cols, 81);
    const Tensor dout = random_f32(Shape{rows, cols}, 82);
    const Tensor out = ops::softmax(x, -1);
    const Tensor gout = cuda::softmax(to_device(x, kGpu));
    expect_close(gout, out, 2e-6, 1e-9, what);
    const Tensor gdx = cuda::softmax_backward(to_device(out, kGpu), to_device(dout, kGpu));
    expect_close(gdx, ops::softmax_backward(out, dout, -1), 1e-6, 1e-9, what + " backward");
    EXPECT_TRUE(bit_equal(gout, cuda::softmax(to_device(x, kGpu)))) << what << ": not deterministic";
  }
}

// Softmax in bf16 (f32 math on bf16 rows; the CPU computes bf16 rows in double): one bf16 ulp
// (2^-8) apart at most, 8e-3 relative; the backward's double sums differ in order only, rounded once
// to bf16 on both sides: 8e-3. Rows with a causal mask's -1e9 entries too (-1e9 is a bf16 value
// to 2^-8).
TEST_F(CudaKernels, SoftmaxBf16ForwardAndBackwardEqualTheCpuKernels) {
  for (auto [rows, cols] : kNormSizes) {
    const std::string what = "bf16 softmax " + std::to_string(rows) + "x" + std::to_string(cols);
    const Tensor x = masked_rows(rows, cols, 83).to(DType::BF16);
    const Tensor dout = random_f32(Shape{rows, cols}, 84).to(DType::BF16);
    const Tensor out = ops::softmax(x, -1);
    const Tensor gout = cuda::softmax(to_device(x, kGpu));
    ASSERT_EQ(gout.dtype(), DType::BF16);
    expect_close(gout, out, 8e-3, 1e-9, what);
    const Tensor gdx = cuda::softmax_backward(to_device(out, kGpu), to_device(dout, kGpu));
    expect_close(gdx, ops::softmax_backward(out, dout, -1), 8e-3, 1e-9, what + " backward");
    EXPECT_TRUE(bit_equal(gout, cuda::softmax(to_device(x, kGpu)))) << what << ": not deterministic";
    EXPECT_TRUE(bit_equal(gdx, cuda::softmax_backward(to_device(out, kGpu), to_device(dout, kGpu))))
        << what << " backward: not deterministic";
  }
}

// Cross-entropy: the CPU's f32 rows take float exponentials (fast_expf, a few ulp) with double
// sums; the GPU takes double exponentials: 1e-5 relative, atol 1e-6 on dlogits.
TEST_F(CudaKernels, CrossEntropyForwardAndBackwardEqualTheCpuKernels) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1}, {3, 7}, {33, 1000}, {8, 50257}};
  const std::pair<cuda::Reduction, ops::LossReduction> reductions[] = {
      {cuda::Reduction::None, ops::LossReduction::None},
      {cuda::Reduction::Sum, ops::LossReduction::Sum},
      {cuda::Reduction::Mean, ops::LossReduction::Mean}};
  for (auto [rows, classes] : sizes) {
    const Tensor logits = random_f32(Shape{rows, classes}, 41, -8.f, 8.f);
    std::vector<int64_t> lab(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) lab[static_cast<size_t>(r)] = r % 5 == 4 ? -100 : (r * 7919) % classes;
    const Tensor labels = Tensor::from<int64_t>(Shape{rows}, lab);
    const Tensor glogits = to_device(logits, kGpu), glabels = to_device(labels, kGpu);
    for (auto [gred, cred] : reductions) {
      const std::string what = "cross_entropy " + std::to_string(rows) + "x" + std::to_string(classes) + " reduction " +
                               std::to_string(static_cast<int>(cred));
      const Tensor loss = ops::cross_entropy(logits, labels, -100, cred);
      expect_close(cuda::cross_entropy(glogits, glabels, -100, gred), loss, 1e-5, 1e-6, what);
      const Tensor dloss = random_f32(loss.shape(), 42, 0.5f, 1.5f);
      const Tensor d = ops::cross_entropy_backward(logits, labels, dloss, -100, cred);
      const Tensor gd = cuda::cross_entropy_backward(glogits, glabels, to_device(dloss, kGpu), -100, gred);
      expect_close(gd, d, 1e-5, 1e-6, what + " dlogits");
    }
  }
}

TEST_F(CudaKernels, CrossEntropyNamesALabelOutOfRange) {
  const Tensor logits = to_device(random_f32(Shape{4, 10}, 5), kGpu);
  const Tensor labels = to_device(Tensor::from<int64_t>(Shape{4}, std::vector<int64_t>{1, 2, 10, 3}), kGpu);
  try {
    cuda::cross_entropy(logits, labels, -100, cuda::Reduction::Mean);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 10 of row 2 is outside [0, 10)"), std::string::npos) << e.what();
  }
}

TEST_F(CudaKernels, AHostTensorIsAnErrorNamingTheArgument) {
  const Tensor x = random_f32(Shape{3}, 1);
  try {
    cuda::activation(cuda::Activation::Gelu, x);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda activation: x must be a f32 tensor on"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise::cuda_test
