// graph::apply_recompute on a small graph: only the segment nodes whose values a gradient reads are
// repeated, the copies run after the forward and before the first gradient that reads them, and
// the gradients are bit for bit those of the same graph without the segment.
#include <gtest/gtest.h>

#include <cstring>

#include "shardwise/comm/local.h"
#include "shardwise/core/philox.h"
#include "shardwise/graph/autodiff.h"
#include "shardwise/graph/recompute.h"
#include "shardwise/runtime/runtime.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise {
namespace {

// loss = sum(scale(softmax(x) w + b)): softmax's gradient reads its output and the matmul's reads
// softmax's output and w; the add's and the scale's read nothing. With the segment around softmax,
// matmul, add and scale, only softmax is repeated (x comes from outside the segment).
void build(graph::Graph& g, bool segment) {
  auto x = g.input("x", Shape{4, 6});
  auto w = g.param("w", Shape{6, 5});
  auto b = g.param("b", Shape{5});
  auto pre = g.scale(x, 2.0, 0.0, "pre");  // outside: its value enters the segment
  g.value(pre).requires_grad = true;
  if (segment) g.begin_segment();
  auto s = g.softmax(pre, -1, "s");
  auto y = g.scale(g.add(g.matmul(s, w, false, "sw"), b, "h"), 0.5, 0.0, "y");
  if (segment) g.end_segment();
  g.sum(y, {}, false, "loss");
}

struct Outcome {
  std::map<std::string, Tensor> grads;
  std::string plan;
  int copies = 0;
};

Outcome run(bool segment) {
  Outcome out;
  graph::Graph g;
  build(g, segment);
  graph::append_backward(g, g.get("loss"));
  mesh::ProcessMesh one(Shape{1});
  graph::Completion c = graph::complete(g, one);
  graph::RecomputeResult r = graph::apply_recompute(g, c);
  out.copies = r.copies;
  graph::Program p = graph::lower(g, c, {}, r.order);
  out.plan = p.to_string(g);
  comm::LocalWorld::run(1, [&](comm::Communicator& world) {
    runtime::Runtime rt(g, p, world.group(world.members()));
    ops::ValueGen gen;
    rt.set_global("x", verify::random_tensor(Shape{4, 6}, DType::F32, gen, Philox(3, 1)));
    rt.set_global("w", verify::random_tensor(Shape{6, 5}, DType::F32, gen, Philox(3, 2)));
    rt.set_global("b", verify::random_tensor(Shape{5}, DType::F32, gen, Philox(3, 3)));
    rt.run();
    for (const char* name : {"w", "b"}) out.grads[name] = rt.local_grad(name).clone();
  });
  return out;
}

TEST(Recompute, OnlyWhatTheGradientsReadIsRepeatedBeforeItsFirstReader) {
  const Outcome plain = run(false), rec = run(true);
  EXPECT_EQ(plain.copies, 0);
  EXPECT_EQ(rec.copies, 1) << rec.plan;
  EXPECT_NE(rec.plan.find("recompute_softmax"), std::string::npos) << rec.plan;
  EXPECT_EQ(rec.plan.find("recompute_matmul"), std::string::npos) << rec.plan;
  // After the last forward kernel (the loss) and before the softmax's gradient, which reads it.
  const size_t copy = rec.plan.find("recompute_softmax");
  EXPECT_LT(rec.plan.find("= sum("), copy) << rec.plan;
  EXPECT_LT(copy, rec.plan.find("grad_matmul(s@recompute")) << rec.plan;
  for (const auto& [name, g] : plain.grads) {
    const Tensor& t = rec.grads.at(name);
    ASSERT_EQ(t.nbytes(), g.nbytes());
    EXPECT_EQ(std::memcmp(t.raw(), g.raw(), g.nbytes()), 0) << name;
  }
}

TEST(Recompute, SegmentsDoNotNestAndMustBeClosedBeforeAutodiff) {
  graph::Graph g;
  auto x = g.param("x", Shape{3});
  g.begin_segment();
  EXPECT_THROW(g.begin_segment(), Error);
  auto loss = g.sum(g.op1("tanh", {x}), {}, false, "loss");
  EXPECT_THROW(graph::append_backward(g, loss), Error);
  g.end_segment();
  EXPECT_THROW(g.end_segment(), Error);
  EXPECT_NO_THROW(graph::append_backward(g, loss));
}

}  // namespace
}  // namespace shardwise
