// Completion decisions (annotations win, cheapest leaf layout, explanations), user errors caught
// before anything runs, and the runtime's buffer release.
#include <gtest/gtest.h>

#include "harness.h"
#include "shardwise/graph/completion.h"

namespace shardwise {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Completion, AnAnnotationNamingAMissingMeshDimIsAnErrorBeforeAnythingRuns) {
  graph::Graph g;
  auto x = g.input("x", Shape{4, 4});
  g.relu(x, "y");
  g.annotate(x, "S(0),R,R");  // three mesh dims
  std::string m = error_of([&] { graph::complete(g, mesh::ProcessMesh(Shape{2, 2})); });
  EXPECT_NE(m.find("the annotation [S(0),R,R] of 'x' has 3 mesh dims but mesh [2,2] has 2"), std::string::npos) << m;
}

TEST(Completion, AnnotatedBeatsInferredAndALeafTakesItsCheapestLayout) {
  graph::Graph g;
  auto a = g.input("a", Shape{8, 8}), b = g.input("b", Shape{8, 8}), c = g.input("c", Shape{8, 8});
  auto p = g.param("p", Shape{8, 8});
  g.annotate(a, "S(1)");
  g.annotate(b, "S(0)");
  g.annotate(c, "S(0)");
  // The first consumer wants p as S(1); the two others want S(0): S(0) costs one reshard, not two.
  auto ap = g.add(a, p, "ap");
  auto bp = g.add(b, p, "bp");
  auto cp = g.add(c, p, "cp");
  auto s = g.add(g.add(ap, bp, "s1"), cp, "s");
  g.annotate(s, "R");  // the rule leaves it S(1) (its first operand wins): the annotation wins, a reshard follows
  mesh::ProcessMesh mesh(Shape{2});
  graph::Completion done = graph::complete(g, mesh);
  EXPECT_EQ(done.dist[static_cast<size_t>(p)].to_string(), "S(0)");
  EXPECT_NE(graph::explain(g, done, p).find("the cheapest of the distributions its 3 consumers require"), std::string::npos)
      << graph::explain(g, done, p);
  EXPECT_EQ(done.dist[static_cast<size_t>(s)].to_string(), "R");
  EXPECT_EQ(graph::explain(g, done, s), "s (activation f32 8x8): [R] — annotated by the user");
  EXPECT_GE(done.passes, 2);
  graph::Program prog = graph::lower(g, done);
  EXPECT_NE(prog.to_string(g).find("reshard s[S(1)] -> [R]"), std::string::npos) << prog.to_string(g);
}

TEST(Runtime, FreesEachBufferAfterItsLastUse) {
  // A chain of 12 elementwise ops on a 64 KiB tensor: at most the input, one live intermediate,
  // the op's output and the kept result are held at once — never the whole chain.
  graph::Graph g;
  auto v = g.input("x", Shape{128, 128});
  for (int i = 0; i < 12; ++i) v = g.relu(g.scale(v, 1.5, 0.1, fmt::format("s{}", i)), fmt::format("r{}", i));
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{1})));
  std::vector<runtime::RunStats> stats(1);
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    runtime::Runtime rt(g, p, c.group(c.members()));
    rt.set_global("x", Tensor::full(DType::F32, Shape{128, 128}, 1.0));
    rt.run();
    stats[0] = rt.stats();
    EXPECT_DOUBLE_EQ(rt.local("r11").at(0), [] {
      double x = 1;
      for (int i = 0; i < 12; ++i) x = x * 1.5 + 0.1;
      return static_cast<double>(static_cast<float>(x));
    }()) ;
    EXPECT_NE(error_of([&] { rt.local("r5"); }).find("'r5' is not held after run()"), std::string::npos);
  });
  const int64_t tensor = 128 * 128 * 4;
  EXPECT_LE(stats[0].peak_bytes, 3 * tensor);
  EXPECT_EQ(stats[0].kernels, 24);
}

TEST(Runtime, AMissingInputIsAnErrorNamingIt) {
  graph::Graph g;
  auto x = g.input("x", Shape{2});
  g.relu(x, "y");
  graph::Program p = graph::lower(g, graph::complete(g, mesh::ProcessMesh(Shape{1})));
  std::string m;
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    runtime::Runtime rt(g, p, c.group(c.members()));
    m = error_of([&] { rt.run(); });
    std::string wrong = error_of([&] { rt.set_global("x", Tensor(DType::F32, Shape{3})); });
    EXPECT_NE(wrong.find("'x' is f32 2, got f32 3"), std::string::npos) << wrong;
  });
  EXPECT_NE(m.find("'x' is not set"), std::string::npos) << m;
}

}  // namespace
}  // namespace shardwise
