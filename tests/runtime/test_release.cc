// The runtime features pipelines use: an execution order run in pieces, swapped buffer sets, the
// release of tensors gradient kernels read for their shape only (stand-ins poisoned with NaN: a
// kernel that read one would turn the gradients into NaN), a seeded backward with the stage input's
// gradient, and the split of a matmul's weight gradient into a node of its own.
#include <gtest/gtest.h>

#include "shardwise/comm/local.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/completion.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise {
namespace {

struct Net {
  graph::Graph g;
  graph::ValueId x = -1, y = -1, seed = -1;
  size_t forward_nodes = 0;
};

// y = gelu(x @ w + b) + x, a "stage" of 3 such blocks; backward seeded from an input like y.
Net build(bool split) {
  Net n;
  n.x = n.g.input("x", Shape{16, 64});
  n.g.value(n.x).requires_grad = true;
  graph::ValueId h = n.x;
  for (int i = 0; i < 3; ++i) {
    auto w = n.g.param(fmt::format("w{}", i), Shape{64, 64});
    auto b = n.g.param(fmt::format("b{}", i), Shape{64});
    h = n.g.add(n.g.gelu(n.g.add(n.g.matmul(h, w, false, fmt::format("mm{}", i)), b, fmt::format("lin{}", i))), h,
                fmt::format("res{}", i));
  }
  n.y = h;
  n.seed = n.g.input("y@seed", Shape{16, 64});
  n.forward_nodes = n.g.nodes().size();
  graph::AutodiffOptions o;
  o.seed = n.seed;
  o.split_param_grads = split;
  graph::append_backward(n.g, n.y, o);
  return n;
}

std::map<std::string, Tensor> data() {
  std::map<std::string, Tensor> d;
  uint64_t k = 0;
  for (std::string name : {"x", "y@seed", "w0", "w1", "w2", "b0", "b1", "b2"}) {
    Shape s = name[0] == 'w' ? Shape{64, 64} : name[0] == 'b' ? Shape{64} : Shape{16, 64};
    d[name] = verify::random_tensor(s, DType::F32, {}, Philox(7, ++k));
  }
  return d;
}

struct PieceRun {
  std::map<std::string, Tensor> grads;
  int64_t peak_forward_to_backward = 0;  // bytes held between the two pieces
};

PieceRun run(const Net& n, bool release) {
  PieceRun out;
  comm::LocalWorld::run(1, [&](comm::Communicator& world) {
    graph::Program p = graph::lower(n.g, graph::complete(n.g, mesh::ProcessMesh(Shape{1})));
    // Forward instructions first (program order), then the rest.
    std::vector<int> order;
    size_t forward_end = 0;
    for (size_t i = 0; i < p.instrs.size(); ++i)
      if (p.instrs[i].node >= 0 && static_cast<size_t>(p.instrs[i].node) < n.forward_nodes) order.push_back(static_cast<int>(i));
    forward_end = order.size();
    for (size_t i = 0; i < p.instrs.size(); ++i)
      if (!(p.instrs[i].node >= 0 && static_cast<size_t>(p.instrs[i].node) < n.forward_nodes)) order.push_back(static_cast<int>(i));
    runtime::Runtime rt(n.g, p, world.group(world.members()), runtime::RuntimeOptions{order, release, true});
    for (auto& [name, t] : data())
      if (name != "y@seed") rt.set_global(name, t);
    rt.free_after_use("x");
    rt.run(0, forward_end);
    int64_t held = 0;
    for (const Tensor& t : rt.buffers()) held += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
    out.peak_forward_to_backward = held;
    std::vector<Tensor> frame = rt.take_buffers();  // parked, as a pipeline parks a micro-batch
    rt.set_buffers(std::move(frame));
    rt.set_global("y@seed", data()["y@seed"]);
    rt.run(forward_end, rt.size());
    for (std::string name : {"w0", "w1", "w2", "b0", "b1", "b2"}) out.grads[name] = rt.local_grad(name);
    out.grads["x"] = rt.local(n.g.value(n.g.value(n.x).grad).name);
  });
  return out;
}

// Reference: the same net, seeded by multiplying with the seed and summing (an ordinary scalar loss).
std::map<std::string, Tensor> reference() {
  std::map<std::string, Tensor> out;
  comm::LocalWorld::run(1, [&](comm::Communicator& world) {
    graph::Graph r;
    auto x = r.input("x", Shape{16, 64});
    r.value(x).requires_grad = true;
    graph::ValueId h = x;
    for (int i = 0; i < 3; ++i) {
      auto w = r.param(fmt::format("w{}", i), Shape{64, 64});
      auto b = r.param(fmt::format("b{}", i), Shape{64});
      h = r.add(r.gelu(r.add(r.matmul(h, w), b)), h);
    }
    auto seed = r.input("y@seed", Shape{16, 64});
    auto loss = r.sum(r.multiply(h, seed), {}, false, "loss");
    graph::append_backward(r, loss);
    graph::Program p = graph::lower(r, graph::complete(r, mesh::ProcessMesh(Shape{1})));
    runtime::Runtime rt(r, p, world.group(world.members()));
    for (auto& [name, t] : data()) rt.set_global(name, t);
    rt.run();
    for (std::string name : {"w0", "w1", "w2", "b0", "b1", "b2"}) out[name] = rt.local_grad(name);
    out["x"] = rt.local(r.value(r.value(x).grad).name);
  });
  return out;
}

TEST(RuntimePieces, ReleaseSplitAndSeedGiveTheReferenceGradientsAndHoldLess) {
  auto ref = reference();
  PieceRun keep = run(build(false), false);
  for (bool split : {false, true}) {
    PieceRun rel = run(build(split), true);
    for (auto& [name, g] : ref) {
      CompareResult c = compare(rel.grads[name], g, 1e-5, 1e-6);
      EXPECT_TRUE(c.equal) << (split ? "split " : "") << name << ": " << c.message;
      EXPECT_TRUE(compare(keep.grads[name], g, 1e-5, 1e-6).equal) << name;
    }
    // Released between forward and backward: the sums' and the residual adds' operands.
    EXPECT_LT(rel.peak_forward_to_backward, keep.peak_forward_to_backward);
  }
  // The split gives each matmul with a weight two gradient nodes.
  Net s = build(true), whole = build(false);
  EXPECT_EQ(s.g.nodes().size(), whole.g.nodes().size() + 3);
}

TEST(RuntimePieces, AnOrderThatIsNotAPermutationIsAnError) {
  Net n = build(false);
  comm::LocalWorld::run(1, [&](comm::Communicator& world) {
    graph::Program p = graph::lower(n.g, graph::complete(n.g, mesh::ProcessMesh(Shape{1})));
    try {
      runtime::Runtime rt(n.g, p, world.group(world.members()), runtime::RuntimeOptions{{0, 0}, false, false});
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be a permutation"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace shardwise
