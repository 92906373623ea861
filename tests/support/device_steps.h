#pragma once
// A few training steps of the GPT-2 or Llama tiny programs with every tensor on one device (the host
// for the CPU run), with the model's parameter dtype (bf16 parameters: `train --bf16`'s program, the
// SGD update in bf16 and the gradient norm in f32), shared by the fake-device test (tests/train/test_device_program.cc) and the GPU
// test (tests/cuda/test_cuda_program.cc): plain SGD written with ops on one batch, rank 0's losses
// and gradient norms, the device copies and the runtime's streams.
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/models/models.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/tensor/current_stream.h"
#include "shardwise/tensor/device_copy.h"
#include "tests/support/llama_config.h"
#include "tests/support/small_config.h"

namespace shardwise::train {

constexpr int64_t kBatch = 4;
constexpr int kSteps = 3;
constexpr double kLr = 0.05;

struct StepsRun {
  std::vector<float> losses, norms;  // rank 0's
  DeviceCopyStats copies;            // from the parameters' binding to the end, every rank
  int64_t params = 0, constants = 0, reshards = 0;
  bool all_on_device = true;  // every buffer each runtime held after each step
  std::set<void*> compute, comm;  // the ranks' streams
};

inline std::vector<Tensor> op(const std::string& name, std::vector<Tensor> in, const Attrs& attrs = {}) {
  return ops::run_forward(ops::op_registry().get(name), in, attrs);
}

inline Tensor batch_tensor(int64_t vocab, int64_t seq, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int64_t> v(static_cast<size_t>(kBatch * seq));
  for (int64_t& x : v) x = dist(gen);
  return Tensor::from<int64_t>(Shape{kBatch, seq}, v);
}

// kSteps steps of SGD (p -= lr * g, written with ops) on one batch on `mesh` (threads), every tensor on `device`
// (the host: the CPU run). Each rank binds its blocks; the host reads the loss and the gradient norm.
inline StepsRun run_steps(const GptConfig& model, const std::string& mesh, Device device) {
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
      bind(val.name, init_model_param(model, val.name, val.meta.shape, 7).to(val.meta.dtype));  // bf16 with --bf16
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
        const Tensor g32 = g.dtype() == DType::F32 ? g : op("cast", {g}, Attrs{{"dtype", std::string("f32")}})[0];
        const Tensor sq = op("sum", op("multiply", {g32, g32}))[0];
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

// The GPT-2 tiny model ("gpt2") or the Llama one ("llama") of the trainer tests, or that Llama with
// a Mixtral MoE MLP in every layer ("mixtral": 4 experts, top-2, dropless), dp=1; with the suffix
// "_bf16" under --compute bf16 (models/compute.h).
inline GptConfig model_of(const std::string& name) {
  const bool bf16 = name.ends_with("_bf16");
  const std::string base = bf16 ? name.substr(0, name.size() - 5) : name;
  SW_CHECK(base == "gpt2" || base == "llama" || base == "mixtral", "model_of: unknown model '{}'", name);
  GptConfig c = base == "gpt2" ? small_config("dp=1", 1).model : llama_test_config("dp=1").model;
  if (base == "mixtral") c.experts = 4, c.top_k = 2;
  if (bf16) c.compute_dtype = DType::BF16;
  return c;
}

}  // namespace shardwise::train
