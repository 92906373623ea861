// Whole training programs on a GPU: the GPT-2 and Llama tiny programs of the fake-device test
// (tests/support/device_steps.h) with parameters, inputs and every activation and gradient on
// cuda:0, run by the CUDA kernels bound in cuda_ops, for 3 steps of SGD: the losses and gradient
// norms equal the CPU run's within 1e-4 relative (f32 kernels; TF32 off, the CUDA bindings'
// default; the CUDA kernels sum in other orders than the CPU's, so not bit for bit). With bf16
// parameters too (`train --bf16`'s program: each cast to f32 where it is read, the gradients cast
// back, the SGD update in bf16): a gradient a summation order apart may round to a neighbouring bf16
// value, and the update moves the parameters by it, so the losses and norms are held to 1e-3. The host
// reads what the fake device's run reads (the loss and the gradient norm each step) plus the CUDA
// kernels' check flags (one i64 per embedding forward and gradient and per cross_entropy forward)
// and moe_plan's expert row counts. The --compute bf16 programs ("gpt2_bf16", "llama_bf16",
// "mixtral_bf16": bf16 cuBLASLt GEMMs, bf16 attention, head and expert GEMMs; a binding that
// refuses bf16 fails naming itself) within 2e-3: the GPU's f32 sums differ from the CPU's in the
// last bits, which flips some roundings of bf16 products (2^-8 apart). "mixtral" (f32) and
// "mixtral_bf16" were added without a GPU to run them.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "shardwise/cuda_ops/bind.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/device_steps.h"

namespace shardwise::train {
namespace {

constexpr double kRelTol = 1e-4, kBf16ParamsRelTol = 1e-3, kBf16ComputeRelTol = 2e-3;

// What the kernels of the program's step read back, copies and bytes: one i64 check flag each for
// embedding's forward and gradient (the ids) and cross_entropy's forward (the labels); the experts'
// row counts ([E] i64, cuda::moe_plan) for moe_mlp's forward and gradient.
struct HostReads {
  int64_t copies = 0, bytes = 0;
};
HostReads kernel_reads(const GptConfig& model) {
  GptGraph gpt = build_model(model, Strategy::from_mesh(mesh::parse_mesh("dp=1"), false), kBatch);
  graph::append_backward(gpt.g, gpt.loss);
  HostReads r;
  for (const graph::Node& node : gpt.g.nodes()) {
    const bool fwd = node.kind == graph::NodeKind::Forward, bwd = node.kind == graph::NodeKind::Backward;
    if ((node.op == "embedding" && (fwd || bwd)) || (node.op == "cross_entropy" && fwd)) ++r.copies, r.bytes += 8;
    if (node.op == "moe_mlp" && (fwd || bwd)) ++r.copies, r.bytes += 8 * model.experts;
  }
  return r;
}

class CudaProgram : public cuda_test::Gpu, public testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    cuda_test::Gpu::SetUp();
    if (IsSkipped()) return;
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, cuda_ops::cuda_kernel_table());
    installed_ = true;
  }
  void TearDown() override {
    if (installed_) ops::install_device_kernels(DeviceKind::Cuda, previous_);
  }
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
  bool installed_ = false;
};

void expect_relative(float got, float want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(double(got) - double(want)), tol * std::abs(double(want))) << what << ": " << got << " vs "
                                                                               << want;
}

// "gpt2", "llama", "mixtral" (f32), "gpt2_params_bf16", "llama_params_bf16" (bf16 parameters:
// `train --bf16`'s program), "gpt2_bf16", "llama_bf16", "mixtral_bf16" (`--compute bf16`: GEMM,
// attention and expert operands in bf16).
GptConfig model_of_param(const std::string& param) {
  const std::string suffix = "_params_bf16";
  if (!param.ends_with(suffix)) return model_of(param);
  GptConfig model = model_of(param.substr(0, param.size() - suffix.size()));
  model.param_dtype = DType::BF16;
  return model;
}

TEST_P(CudaProgram, GpuStepsEqualTheCpuWithinTolerance) {
  const GptConfig model = model_of_param(GetParam());
  const StepsRun cpu = run_steps(model, "dp=1", Device::host());
  reset_device_copy_stats();
  const StepsRun dev = run_steps(model, "dp=1", cuda_test::kGpu);
  ASSERT_EQ(dev.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(dev.all_on_device);
  const double tol = model.compute_dtype == DType::BF16 ? kBf16ComputeRelTol
                     : model.param_dtype == DType::BF16 ? kBf16ParamsRelTol
                                                        : kRelTol;
  for (int s = 0; s < kSteps; ++s) {
    expect_relative(dev.losses[s], cpu.losses[s], tol, "loss of step " + std::to_string(s));
    expect_relative(dev.norms[s], cpu.norms[s], tol, "gradient norm of step " + std::to_string(s));
  }
  EXPECT_LT(dev.losses.back(), dev.losses.front());  // the steps train
  const HostReads reads = kernel_reads(model);
  ASSERT_GT(reads.copies, 0);
  EXPECT_EQ(dev.copies.to_host_copies, kSteps * (2 + reads.copies));
  EXPECT_EQ(dev.copies.to_host_bytes, kSteps * (2 * 4 + reads.bytes));
  EXPECT_EQ(dev.copies.to_device_copies, dev.params + dev.constants + 2 * kSteps);
}

// The GPU test's expectations that hold on any machine: the bf16 programs on the fake device (the
// CPU kernels on device memory) equal the CPU run bit for bit with the same counted copies, so a
// difference on the GPU is the CUDA kernels'.
TEST(CudaProgramOnTheFakeDevice, Bf16ProgramsEqualTheCpuWithTheGpuTestsCopyCounts) {
  register_fake_device({.index = 7});  // no real GPU's index taken
  const auto previous = ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  for (const std::string name : {"gpt2_params_bf16", "llama_params_bf16"}) {
    const GptConfig model = model_of_param(name);
    const StepsRun cpu = run_steps(model, "dp=1", Device::host());
    reset_device_copy_stats();
    const StepsRun dev = run_steps(model, "dp=1", Device::cuda(7));
    EXPECT_EQ(dev.losses, cpu.losses) << name;
    EXPECT_EQ(dev.norms, cpu.norms) << name;
    EXPECT_LT(cpu.losses.back(), cpu.losses.front()) << name;
    EXPECT_EQ(dev.copies.to_host_copies, kSteps * 2) << name;  // the fake kernels read no check flags
    EXPECT_EQ(dev.copies.to_device_copies, dev.params + dev.constants + 2 * kSteps) << name;
  }
  ops::install_device_kernels(DeviceKind::Cuda, previous);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaProgram,
                         testing::Values("gpt2", "llama", "mixtral", "gpt2_params_bf16", "llama_params_bf16",
                                         "gpt2_bf16", "llama_bf16", "mixtral_bf16"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace shardwise::train
