// Whole training programs on the fake device (tensor/fake_device.h, ops/fake_device_kernels.h):
// GPT-2 and Llama tiny with parameters, inputs and every activation and gradient in fake-device
// memory (PROT_NONE outside its copies and kernel windows), for a few steps of plain SGD written
// with ops, give the CPU run's losses and gradient norms bit for bit, and the only device-to-host
// copies per step are the two values the host needs: the loss and the gradient norm. On dp=2 and
// tp=2 (threads) too, with the ordering rules of streams checked from the fake device's log.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/models/models.h"
#include "shardwise/ops/fake_device_kernels.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {
namespace {

constexpr int64_t kBatch = 4;
constexpr int kSteps = 3;
constexpr double kLr = 0.05;
const Device kFake = Device::cuda(0);

struct StepsRun {
  std::vector<float> losses, norms;  // rank 0's
  DeviceCopyStats copies;            // from the parameters' binding to the end, every rank
  int64_t params = 0, constants = 0, reshards = 0;
  bool all_on_device = true;  // every buffer each runtime held after each step
  std::set<void*> compute, comm;  // the ranks' streams
};

std::vector<Tensor> op(const std::string& name, std::vector<Tensor> in, const Attrs& attrs = {}) {
  return ops::run_forward(ops::op_registry().get(name), in, attrs);
}

Tensor batch_tensor(int64_t vocab, int64_t seq, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int64_t> v(static_cast<size_t>(kBatch * seq));
  for (int64_t& x : v) x = dist(gen);
  return Tensor::from<int64_t>(Shape{kBatch, seq}, v);
}

// kSteps steps of SGD (p -= lr * g, written with ops) on one batch on `mesh` (threads), every tensor on `device`
// (the host: the CPU run). Each rank binds its blocks; the host reads the loss and the gradient norm.
StepsRun run_steps(const GptConfig& model, const std::string& mesh, Device device) {
  StepsRun out;
  std::mutex mu;
  const mesh::ProcessMesh pm = mesh::parse_mesh(mesh);
  comm::LocalWorld::run(static_cast<int>(pm.size()), [&](comm::Communicator& world) {
    Strategy s = Strategy::from_mesh(pm, false);
    GptGraph gpt = build_model(model, s, kBatch);
    graph::append_backward(gpt.g, gpt.loss);
    graph::Program p = graph::lower(gpt.g, graph::complete(gpt.g, s.mesh));
    runtime::Runtime rt(gpt.g, p, world.group(world.members()));
    rt.keep("loss");
    auto bind = [&](const std::string& name, const Tensor& global) {
      const mesh::LocalBlock b = rt.local_block(name);
      const Tensor block = global.slice(b.offsets(), b.shape);
      rt.set_local(name, device.is_host() ? block : to_device(block, device));
    };
    auto read = [&](const Tensor& t) {
      return (device.is_host() ? t : to_host(t, rt.stream())).to(DType::F32).data<float>()[0];
    };
    std::map<std::string, Tensor> params;
    for (graph::ValueId v : gpt.g.params()) {
      const auto& val = gpt.g.value(v);
      bind(val.name, init_model_param(model, val.name, val.meta.shape, 7));
      params[val.name] = rt.local(val.name);
    }
    const auto constants = model_constants(model);
    for (const auto& [name, t] : constants) bind(name, t);
    for (int step = 0; step < kSteps; ++step) {
      for (const auto& [name, t] : params) rt.set_local(name, t);
      bind("ids", batch_tensor(model.vocab, model.seq, 10));  // one batch: the loss must fall
      bind("labels", batch_tensor(model.vocab, model.seq, 20));
      rt.run();
      StreamScope on_compute(rt.stream());  // the update's kernels too
      bool on = true;
      for (const Tensor& b : rt.buffers()) on = on && (!b.defined() || b.device() == device);
      const float loss = read(rt.local("loss"));
      Tensor norm2;
      for (auto& [name, w] : params) {
        const Tensor g = rt.local_grad(name);
        const Tensor sq = op("sum", op("multiply", {g, g}))[0];
        norm2 = norm2.defined() ? op("add", {norm2, sq})[0] : sq;
        w = op("add", {w, op("scale", {g}, Attrs{{"scale", -kLr}})[0]})[0];
      }
      const float norm = read(norm2);
      std::lock_guard lock(mu);
      out.all_on_device = out.all_on_device && on;
      out.reshards += rt.stats().reshards;
      if (world.rank() == 0) out.losses.push_back(loss), out.norms.push_back(norm);
    }
    std::lock_guard lock(mu);
    out.params = static_cast<int64_t>(params.size()), out.constants = static_cast<int64_t>(constants.size());
    out.compute.insert(rt.stream().handle);
    out.comm.insert(rt.comm_stream().handle);
  });
  out.copies = device_copy_stats();
  return out;
}


struct Case {
  std::string model, mesh;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << c.mesh; }
};

GptConfig model_of(const std::string& name) {
  return name == "llama" ? llama_test_config("dp=1").model : small_config("dp=1", 1).model;
}

class DeviceProgram : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    fake_ = &register_fake_device({.index = 0});
    previous_ = ops::install_device_kernels(DeviceKind::Cuda, ops::fake_device_kernels());
  }
  void TearDown() override { ops::install_device_kernels(DeviceKind::Cuda, previous_); }
  FakeDeviceMemory* fake_ = nullptr;
  std::shared_ptr<const ops::DeviceKernelTable> previous_;
};

TEST_P(DeviceProgram, FakeDeviceStepsEqualTheCpuBitForBitReadingTwoValuesPerStep) {
  const GptConfig model = model_of(GetParam().model);
  const std::string& mesh = GetParam().mesh;
  const int64_t ranks = mesh::parse_mesh(mesh).size();
  reset_device_copy_stats();
  const StepsRun cpu = run_steps(model, mesh, Device::host());
  EXPECT_EQ(cpu.copies.to_host_copies + cpu.copies.to_device_copies, 0);
  reset_device_copy_stats();
  fake_->clear_stream_log();
  const StepsRun dev = run_steps(model, mesh, kFake);
  ASSERT_EQ(dev.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(dev.all_on_device);
  for (int s = 0; s < kSteps; ++s) {
    // Bit for bit: the same kernels on the same numbers, only the memory differs.
    EXPECT_EQ(dev.losses[s], cpu.losses[s]) << "step " << s;
    EXPECT_EQ(dev.norms[s], cpu.norms[s]) << "step " << s;
  }
  EXPECT_LT(cpu.losses.back(), cpu.losses.front());  // the steps train
  // The host reads the loss and the gradient norm, nothing else; it writes the parameters and the
  // constants once, and each step's ids and labels.
  EXPECT_EQ(dev.copies.to_host_copies, kSteps * 2 * ranks);
  EXPECT_EQ(dev.copies.to_host_bytes, kSteps * 2 * ranks * 4);
  EXPECT_EQ(dev.copies.to_device_copies, ranks * (dev.params + dev.constants + 2 * kSteps));

  // The streams: every kernel on a compute stream; each reshard on a communication stream after an
  // event of the compute stream, and the compute stream after an event of the communication stream;
  // the host waits only for its copies, and only on compute streams.
  std::map<uint64_t, void*> recorded_on;
  int64_t launches = 0, comm_waits = 0, compute_waits = 0, syncs = 0;
  using K = FakeDeviceMemory::StreamEvent::Kind;
  for (const FakeDeviceMemory::StreamEvent& e : fake_->stream_log()) {
    switch (e.kind) {
      case K::Launch:
        ++launches;
        EXPECT_TRUE(dev.compute.contains(e.stream)) << "a kernel on stream " << e.stream;
        break;
      case K::Record: recorded_on[e.event] = e.stream; break;
      case K::Wait:
        ASSERT_TRUE(recorded_on.contains(e.event));
        if (dev.comm.contains(e.stream)) {
          ++comm_waits;
          EXPECT_TRUE(dev.compute.contains(recorded_on[e.event]));
        } else {
          ++compute_waits;
          EXPECT_TRUE(dev.compute.contains(e.stream));
          EXPECT_TRUE(dev.comm.contains(recorded_on[e.event]));
        }
        break;
      case K::Synchronize:
        ++syncs;
        EXPECT_TRUE(dev.compute.contains(e.stream) || e.stream == nullptr) << "a host wait on stream " << e.stream;
        break;
      default: break;
    }
  }
  EXPECT_GT(launches, 0);
  EXPECT_EQ(comm_waits, dev.reshards);
  EXPECT_EQ(compute_waits, dev.reshards);
  if (ranks > 1) {
    EXPECT_GT(dev.reshards, 0);
  }
  EXPECT_EQ(syncs, dev.copies.to_host_copies + dev.copies.to_device_copies);
  EXPECT_EQ(dev.compute.size(), static_cast<size_t>(ranks));
  EXPECT_EQ(dev.comm.size(), static_cast<size_t>(ranks));
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceProgram,
                         testing::Values(Case{"gpt2", "dp=1"}, Case{"llama", "dp=1"}, Case{"gpt2", "dp=2"},
                                         Case{"gpt2", "tp=2"}, Case{"llama", "tp=2"}),
                         [](const testing::TestParamInfo<Case>& info) {
                           std::string mesh = info.param.mesh;
                           mesh.erase(mesh.find('='), 1);
                           return info.param.model + "_" + mesh;
                         });

}  // namespace
}  // namespace shardwise::train
