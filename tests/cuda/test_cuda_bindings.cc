// The CUDA bindings' argument checks that run before any CUDA launch (cuda_ops/families.h), on a
// fake device registered as cuda:7 (no GPU needed, and no real GPU's index taken): a view op runs
// on the device tensor as it is, and an attribute combination the CUDA kernels lack is an Error
// naming the op and the attribute, never a launch. The kernels themselves run only on a GPU
// (test_cuda_program.cc and the per-kernel tests).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/cuda_ops/bind.h"
#include "shardwise/cuda_ops/families.h"
#include "shardwise/mesh/dist_attr.h"
#include "shardwise/mesh/process_mesh.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/error_of.h"

namespace shardwise {
namespace {

const Device kFake = Device::cuda(7);

class CudaBindings : public testing::Test {
 protected:
  void SetUp() override {
    register_fake_device({.index = 7});
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, cuda_ops::cuda_kernel_table());
  }
  void TearDown() override { ops::install_device_kernels(DeviceKind::Cuda, previous_); }
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
};

Tensor on_fake(const Shape& shape) { return to_device(Tensor::full(DType::F32, shape, 0.5), kFake); }

std::string forward_error(const std::string& op, std::vector<Tensor> in, const Attrs& attrs) {
  return error_of([&] { ops::run_forward(ops::op_registry().get(op), in, attrs); });
}

void expect_names(const std::string& e, const std::string& op, const std::string& what) {
  EXPECT_NE(e.find("op '" + op + "' on cuda:7"), std::string::npos) << e;
  EXPECT_NE(e.find(what), std::string::npos) << e;
}

TEST_F(CudaBindings, SoftmaxOverAnotherDimThanTheLastIsRefusedNamingTheAxis) {
  expect_names(forward_error("softmax", {on_fake(Shape{3, 4})}, Attrs{{"axis", int64_t{0}}}), "softmax",
               "axis 0 (the CUDA kernel: the last dim only)");
}

TEST_F(CudaBindings, ReshapeIsAViewOfTheDeviceTensorForwardAndBack) {
  const Tensor x = on_fake(Shape{2, 6});
  reset_device_copy_stats();
  const ops::OpDef& op = ops::op_registry().get("reshape");
  const Attrs attrs{{"shape", std::vector<int64_t>{3, 4}}};
  const std::vector<Tensor> in{x};
  const std::vector<Tensor> y = ops::run_forward(op, in, attrs);
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].shape(), (Shape{3, 4}));
  EXPECT_EQ(y[0].device(), kFake);
  EXPECT_EQ(y[0].device_ptr(), x.device_ptr());  // the same memory: no kernel, no copy
  const std::vector<Tensor> dx = ops::run_backward(op, in, y, y, attrs);
  ASSERT_EQ(dx.size(), 1u);
  EXPECT_EQ(dx[0].shape(), (Shape{2, 6}));
  EXPECT_EQ(dx[0].device_ptr(), x.device_ptr());
  const DeviceCopyStats c = device_copy_stats();
  EXPECT_EQ(c.to_host_copies + c.to_device_copies, 0);
}

std::vector<Tensor> qkv() { return {on_fake(Shape{1, 2, 4, 8}), on_fake(Shape{1, 2, 4, 8}), on_fake(Shape{1, 2, 4, 8})}; }

TEST_F(CudaBindings, AttentionDropoutIsRefusedNamingIt) {
  const Attrs a{{"scale", 0.25}, {"p", 0.1}, {"seed", int64_t{3}}};
  expect_names(forward_error("flash_attention", qkv(), a), "flash_attention", "attention dropout (p = 0.1 while training)");
  // Not training: no dropout, so nothing to refuse there (the kernel would run; not here without a GPU).
}

TEST_F(CudaBindings, ContextParallelBalancedOrderIsRefusedNamingIt) {
  const Attrs a{{"scale", 0.25}, {"balanced_ranks", int64_t{2}}};
  expect_names(forward_error("flash_attention", qkv(), a), "flash_attention", "balanced_ranks 2");
}

TEST_F(CudaBindings, KeysOtherThanTheWholeSequenceAreRefused) {
  std::vector<Tensor> in = qkv();
  in[1] = on_fake(Shape{1, 2, 2, 8}), in[2] = on_fake(Shape{1, 2, 2, 8});
  expect_names(error_of([&] { ops::run_device_forward(ops::op_registry().get("flash_attention"), kFake, in,
                                                      Attrs{{"scale", 0.25}}, nullptr); }),
               "flash_attention", "keys other than q's whole sequence");
}

TEST_F(CudaBindings, TheHeadsGradientForReductionNoneIsRefused) {
  const Tensor h = on_fake(Shape{4, 8}), w = on_fake(Shape{16, 8});
  const Tensor labels = to_device(Tensor::full(DType::I64, Shape{4}, 1.0), kFake);
  const Tensor loss = on_fake(Shape{4});
  const std::vector<Tensor> in{h, w, labels}, out{loss}, dout{loss};
  const ops::OpDef& op = ops::op_registry().get("lm_head_cross_entropy");
  const std::string e = error_of([&] {
    ops::run_device_backward(op, kFake, in, out, dout, Attrs{{"reduction", std::string("none")}}, nullptr, {});
  });
  expect_names(e, "lm_head_cross_entropy", "the gradient of reduction 'none'");
}

// The error of `op` on `in` (the same fake-device tensors for both) on each of two ranks (threads) of
// a 1-D mesh, each with the context entries `entries` gives for its rank (R: "R", split: "S(0)").
using Entries = std::function<std::vector<ops::ShardInfo>(int64_t rank, const mesh::DistAttr& rep,
                                                         const mesh::DistAttr& split)>;
std::vector<std::string> errors_on_two_ranks(const std::string& op, const std::vector<Tensor>& in, const Attrs& attrs,
                                             const Entries& entries) {
  const mesh::ProcessMesh pm = mesh::parse_mesh("tp=2");
  std::vector<std::string> errors(2);
  comm::LocalWorld::run(2, [&](comm::Communicator& world) {
    comm::MeshComm mesh_comm(pm, world.group(world.members()));
    ops::KernelContext ctx;
    ctx.mesh_comm = &mesh_comm;
    ctx.tensors = entries(world.rank(), mesh::parse_dist("R", 1), mesh::parse_dist("S(0)", 1));
    errors[static_cast<size_t>(world.rank())] =
        error_of([&] { ops::run_device_forward(ops::op_registry().get(op), kFake, in, attrs, &ctx); });
  });
  return errors;
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor h = to_host(t);
  return {h.data<double>(), h.data<double>() + h.numel()};
}

// W split on its vocab dim: the binding's combine all-reduces each chunk's f64 row statistics in
// place over the vocab peers on device memory (a DeviceBuffers scope on the current stream): the
// max, then the sums, of the ranks' values, as the CPU op's host all-reduce; a host tensor is an
// Error naming what it expected.
TEST_F(CudaBindings, TheVocabParallelHeadsCombineAllReducesTheRowStatisticsOnDeviceMemory) {
  const std::vector<std::vector<double>> values{{1.5, -2.0, 7.25, 0.0, 3.0, -1.0}, {0.5, 4.0, -3.0, 0.0, 2.5, 8.0}};
  std::vector<std::vector<double>> maxes(2), sums(2);
  std::vector<std::string> host_errors(2);
  comm::LocalWorld::run(2, [&](comm::Communicator& world) {
    const auto r = static_cast<size_t>(world.rank());
    const std::function<void(Tensor&, bool)> combine = cuda_ops::vocab_stats_all_reduce(&world);
    Tensor mx = to_device(Tensor::from<double>(Shape{6}, values[r]), kFake);
    Tensor sm = to_device(Tensor::from<double>(Shape{2, 3}, values[r]), kFake);
    // The copy counts are the process's: rank 0 reads them while no rank copies anything else.
    world.barrier();
    if (r == 0) reset_device_copy_stats();
    world.barrier();
    combine(mx, true);
    combine(sm, false);
    world.barrier();
    if (r == 0) EXPECT_EQ(device_copy_stats().to_host_copies, 0);  // no staging through the host
    world.barrier();
    maxes[r] = host_values(mx);
    sums[r] = host_values(sm);
    Tensor on_host = Tensor::from<double>(Shape{6}, values[r]);
    host_errors[r] = error_of([&] { combine(on_host, true); });
  });
  for (size_t r = 0; r < 2; ++r) {
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(maxes[r][i], std::max(values[0][i], values[1][i])) << r << " " << i;
      EXPECT_EQ(sums[r][i], values[0][i] + values[1][i]) << r << " " << i;
    }
    EXPECT_NE(host_errors[r].find("f64 device memory expected, got f64 on host"), std::string::npos) << host_errors[r];
  }
}

// Tokens and experts split over the ranks run on CUDA (cuda_ops/moe_ranks.h) but for capacity,
// whose positions after the earlier token blocks are not built there: the binding refuses it before
// any launch, naming it. (Before, every call over ranks was refused.)
TEST_F(CudaBindings, MoeOverRanksWithCapacityIsRefusedNamingIt) {
  const std::vector<Tensor> in{on_fake(Shape{2, 4}), on_fake(Shape{2, 4}), on_fake(Shape{1, 3, 4}),
                               on_fake(Shape{1, 3, 4}), on_fake(Shape{1, 4, 3})};
  const std::vector<std::string> errors = errors_on_two_ranks(
      "moe_mlp", in, Attrs{{"top_k", int64_t{1}}, {"capacity_factor", 1.0}},
      [](int64_t r, const mesh::DistAttr& rep, const mesh::DistAttr& split) {
        return std::vector<ops::ShardInfo>{{Shape{4, 4}, {2 * r, 0}, split},
                                           {Shape{2, 4}, {}, rep},
                                           {Shape{2, 3, 4}, {r, 0, 0}, split},
                                           {Shape{2, 3, 4}, {r, 0, 0}, split},
                                           {Shape{2, 4, 3}, {r, 0, 0}, split}};
      });
  for (const std::string& e : errors) {
    expect_names(e, "moe_mlp", "capacity_factor > 0 with the tokens over ranks");
    EXPECT_NE(e.find("not built on CUDA"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace shardwise
