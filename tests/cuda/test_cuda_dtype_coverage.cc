// Do the bound CUDA kernels accept the dtypes the programs give them? Every forward and backward
// node of the programs of step_programs.h (f32 and bf16 parameters) is run through the CUDA table on
// tensors of its own shapes and dtypes on a fake device registered as cuda:7, in a process that sees
// no GPU (CUDA_VISIBLE_DEVICES is emptied before CUDA starts). A binding runs its argument checks
// (dtype, shape, attributes) before its first CUDA call; with no GPU that call fails, so:
//   - an Error from a CUDA or cuBLASLt call ("CUDA: <what> failed", "cuBLASLt: ..."): the checks
//     before it passed, the kernel would launch;
//   - no Error: a view or a fill, nothing to launch;
//   - any other Error: the binding or its kernel refuses these dtypes (or attributes).
// The refused signatures must equal tests/cuda/missing_cuda_dtypes.txt. What this cannot see: a
// check a binding makes after its first CUDA call (a later stage of a multi-kernel op); the CUDA
// call each signature reached is printed so a reader can judge. Nothing here runs a kernel.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/cuda/memory/cuda_memory.h"
#include "shardwise/cuda_ops/bind.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/cuda/step_programs.h"

namespace shardwise {
namespace {

const Device kFake = Device::cuda(7);

std::string dtypes_of(const graph::Graph& g, const std::vector<graph::ValueId>& ids) {
  std::string s;
  for (const graph::ValueId v : ids) {
    if (!s.empty()) s += ",";
    s += v < 0 ? std::string("-") : std::string(dtype_name(g.value(v).meta.dtype));
  }
  return s;
}

// "forward cast bf16 -> f32": the node's kind, op, input and output dtypes ("-": none).
std::string signature(const graph::Graph& g, const graph::Node& n) {
  const char* kind = n.kind == graph::NodeKind::Forward ? "forward " : "backward ";
  return kind + n.op + " " + dtypes_of(g, n.inputs) + " -> " + dtypes_of(g, n.outputs);
}

std::vector<Tensor> zeros_of(const graph::Graph& g, std::span<const graph::ValueId> ids) {
  std::vector<Tensor> out;
  for (const graph::ValueId v : ids) {
    if (v < 0) {
      out.emplace_back();
      continue;
    }
    const ops::TensorMeta& m = g.value(v).meta;
    out.push_back(zeros_on(m.dtype, m.shape, kFake));
  }
  return out;
}

// Runs `f` (a CUDA binding on fake-device tensors): "" when it would launch (or needs no launch),
// `reached` naming the CUDA call it stopped at, else the refusal.
std::string classify(const std::function<void()>& f, std::string& reached) {
  try {
    f();
    reached = "(no launch)";
    return "";
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.starts_with("CUDA: ") || m.starts_with("cuBLASLt: ")) {
      reached = m.substr(0, m.find(" failed"));
      return "";
    }
    return m;
  }
}

// Runs the node's CUDA binding on zeros of its shapes and dtypes (classify).
std::string refusal(const graph::Graph& g, const graph::Node& n, std::string& reached) {
  const ops::OpDef& op = ops::op_registry().get(n.op);
  const std::vector<Tensor> in = zeros_of(g, n.inputs);
  return classify(
      [&] {
        if (n.kind == graph::NodeKind::Forward) {
          ops::run_forward(op, in, n.attrs);
          return;
        }
        const graph::Node& fwd = g.nodes()[static_cast<size_t>(n.forward)];
        const auto ni = static_cast<std::ptrdiff_t>(fwd.inputs.size()), no = static_cast<std::ptrdiff_t>(fwd.outputs.size());
        const std::span<const Tensor> all(in);
        std::unique_ptr<bool[]> wanted(new bool[n.outputs.size()]);
        for (size_t i = 0; i < n.outputs.size(); ++i) wanted[i] = n.outputs[i] >= 0;
        ops::run_backward(op, all.first(ni), all.subspan(ni, no), all.subspan(ni + no), fwd.attrs, nullptr,
                          std::span<const bool>(wanted.get(), n.outputs.size()));
      },
      reached);
}

// Where CUDA starts in this process: hidden from it (before it starts) so that nothing can launch.
bool hide_the_gpus(std::string& why) {
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  return cuda::device_count(&why) == 0;
}

TEST(CudaDtypeCoverage, TheBoundKernelsAcceptEveryDtypeOfTheProgramsOrTheCheckedInListSaysWhich) {
  std::string why;
  if (!hide_the_gpus(why)) {
    GTEST_SKIP() << "CUDA started before this test and sees a GPU: run it alone (ctest runs each test in a process "
                    "of its own)";
  }
  register_fake_device({.index = 7});
  const auto previous = ops::install_device_kernels(DeviceKind::Cuda, cuda_ops::cuda_kernel_table());
  std::map<std::string, std::string> refused, reached_by;  // signature -> message / CUDA call reached
  for (const cuda_test::StepProgram& p : cuda_test::step_programs()) {
    for (const graph::Node& n : p.g.nodes()) {
      if (n.kind == graph::NodeKind::Fill) continue;  // any dtype: cuda::full / a memset
      const std::string sig = signature(p.g, n);
      if (refused.contains(sig) || reached_by.contains(sig)) continue;
      std::string reached;
      const std::string r = refusal(p.g, n, reached);
      if (r.empty()) {
        reached_by[sig] = reached;
      } else {
        refused[sig] = p.name + ": " + r.substr(0, r.find('\n'));
      }
    }
  }
  ops::install_device_kernels(DeviceKind::Cuda, previous);
  std::cout << "accepted (the CUDA call each reached):\n";
  for (const auto& [sig, call] : reached_by) std::cout << "  " << sig << "  [" << call << "]\n";
  std::string missing;
  std::cout << "refused:\n";
  for (const auto& [sig, why_not] : refused) {
    std::cout << "  " << sig << "\n      " << why_not << "\n";
    missing += sig + "\n";
  }
  cuda_test::expect_checked_in_list(missing, "missing_cuda_dtypes.txt");
  EXPECT_GT(reached_by.size(), 20u);  // the walk saw the programs
}

// Kernels no program above reaches yet (`train --bf16` computes in f32 after its casts) that take
// bf16 all the same: softmax forward and backward, and the embedding gradient, reach their launch.
TEST(CudaDtypeCoverage, Bf16SoftmaxAndEmbeddingGradientReachTheirLaunch) {
  std::string why;
  if (!hide_the_gpus(why)) GTEST_SKIP() << "CUDA started before this test and sees a GPU: run it alone";
  register_fake_device({.index = 7});
  const auto previous = ops::install_device_kernels(DeviceKind::Cuda, cuda_ops::cuda_kernel_table());
  const ops::OpDef& op = ops::op_registry().get("softmax");
  const std::vector<Tensor> x{zeros_on(DType::BF16, Shape{3, 5}, kFake)};
  std::string reached;
  EXPECT_EQ(classify([&] { ops::run_forward(op, x, {}); }, reached), "");
  EXPECT_EQ(reached, "CUDA: softmax kernel");
  EXPECT_EQ(classify([&] { ops::run_backward(op, x, x, x, {}); }, reached), "");
  EXPECT_EQ(reached, "CUDA: softmax_backward kernel");
  const ops::OpDef& emb = ops::op_registry().get("embedding");
  const std::vector<Tensor> ew{zeros_on(DType::I64, Shape{2, 3}, kFake), zeros_on(DType::BF16, Shape{11, 4}, kFake)};
  const std::vector<Tensor> dy{zeros_on(DType::BF16, Shape{2, 3, 4}, kFake)};
  const bool wanted[2] = {false, true};
  EXPECT_EQ(classify([&] { ops::run_backward(emb, ew, dy, dy, {}, nullptr, wanted); }, reached), "");
  EXPECT_EQ(reached, "CUDA: embedding id check kernel");
  ops::install_device_kernels(DeviceKind::Cuda, previous);
}

}  // namespace
}  // namespace shardwise
