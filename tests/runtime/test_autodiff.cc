// Autodiff checked against central finite differences of the loss (float64, one device).
#include <gtest/gtest.h>

#include "harness.h"
#include "shardwise/core/philox.h"
#include "shardwise/verify/sim_mesh.h"

namespace shardwise {
namespace {

using testing_support::run_graph;

Tensor random(const Shape& s, uint64_t stream, double lo = -1, double hi = 1) {
  ops::ValueGen gen;
  gen.lo = lo, gen.hi = hi;
  return verify::random_tensor(s, DType::F64, gen, Philox(7, stream));
}

// A graph that uses a value twice (g feeds both operands of multiply and a residual add) and
// an op with auxiliary outputs (layer_norm's mean and rstd).
void build(graph::Graph& g) {
  auto x = g.input("x", Shape{4, 3}, DType::F64);
  auto w = g.param("w", Shape{3, 5}, DType::F64);
  auto b = g.param("b", Shape{5}, DType::F64);
  auto s = g.param("ln_scale", Shape{5}, DType::F64);
  auto t = g.param("ln_bias", Shape{5}, DType::F64);
  auto h = g.add(g.matmul(x, w, false, "xw"), b, "h");
  auto a = g.gelu(h, "a");
  auto sq = g.multiply(a, a, "sq");
  auto r = g.add(sq, a, "r");
  auto n = g.layer_norm(r, s, t, -1, 1e-5, "n");
  g.mean(g.multiply(n, n, "n2"), {}, false, "loss");
}

TEST(Autodiff, GradientsMatchFiniteDifferences) {
  std::map<std::string, Tensor> data = {{"x", random(Shape{4, 3}, 1)},
                                        {"w", random(Shape{3, 5}, 2)},
                                        {"b", random(Shape{5}, 3)},
                                        {"ln_scale", random(Shape{5}, 4, 0.5, 1.5)},
                                        {"ln_bias", random(Shape{5}, 5)}};
  mesh::ProcessMesh one(Shape{1});
  auto result = run_graph(build, one, data, "loss", {"loss"});
  for (const char* p : {"w", "b", "ln_scale", "ln_bias"}) {
    Tensor grad = result.grads.at(p);
    for (int64_t i = 0; i < grad.numel(); ++i) {
      const double eps = 1e-6;
      auto loss_with = [&](double delta) {
        auto d = data;
        d[p] = data[p].clone();
        d[p].set_at(i, data[p].at(i) + delta);
        return run_graph(build, one, d, "loss", {"loss"}).values.at("loss").at(0);
      };
      double numeric = (loss_with(eps) - loss_with(-eps)) / (2 * eps);
      EXPECT_NEAR(grad.at(i), numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << p << " element " << i;
    }
  }
}

TEST(Autodiff, NamesGradientsAndSumsRepeatedUses) {
  graph::Graph g;
  build(g);
  auto grads = graph::append_backward(g, g.get("loss"));
  ASSERT_EQ(grads.size(), 4u);
  EXPECT_EQ(g.value(grads[0]).name, "w@grad");
  // `a` is read three times (twice by multiply, once by add): its gradient is a sum of three.
  const graph::Value& da = g.value(g.value(g.get("a")).grad);
  EXPECT_EQ(da.name, "a@grad");
  EXPECT_EQ(g.node(da.producer).op, "add");
}

TEST(Autodiff, AParameterWithoutAGradientPathIsAnError) {
  graph::Graph g;
  auto x = g.input("x", Shape{2, 2});
  auto w = g.param("w", Shape{2, 2});
  g.param("unused", Shape{3});
  g.sum(g.matmul(x, w), {}, false, "loss");
  try {
    graph::append_backward(g, g.get("loss"));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'unused' has no gradient path to the loss 'loss'"), std::string::npos)
        << e.what();
  }
  graph::AutodiffOptions allow;
  allow.allow_unused_params = true;
  graph::Graph g2;
  auto x2 = g2.input("x", Shape{2, 2});
  auto w2 = g2.param("w", Shape{2, 2});
  g2.param("unused", Shape{3});
  g2.sum(g2.matmul(x2, w2), {}, false, "loss");
  EXPECT_EQ(graph::append_backward(g2, g2.get("loss"), allow)[1], -1);
}

// A frozen parameter (LoRA's base) is read like a parameter but takes no gradient: no Backward
// output for it, nothing in params(); the trained adapter's gradient is still the finite difference.
void build_adapted(graph::Graph& g) {
  auto x = g.input("x", Shape{4, 3}, DType::F64);
  auto w = g.frozen("w", Shape{3, 5}, DType::F64);
  auto a = g.param("lora_A", Shape{2, 3}, DType::F64);
  auto b = g.param("lora_B", Shape{5, 2}, DType::F64);
  auto delta = g.matmul(g.scale(g.matmul(x, a, true, "xa"), 0.5, 0.0, "xa_scaled"), b, true, "delta");
  auto y = g.add(g.matmul(x, w, false, "xw"), delta, "y");
  g.mean(g.multiply(y, y, "y2"), {}, false, "loss");
}

TEST(Autodiff, FrozenParametersTakeNoGradient) {
  graph::Graph g;
  build_adapted(g);
  ASSERT_EQ(g.params().size(), 2u);
  ASSERT_EQ(g.frozen_params().size(), 1u);
  EXPECT_EQ(graph::value_kind_name(g.value(g.get("w")).kind), "frozen");
  graph::append_backward(g, g.get("loss"));
  EXPECT_EQ(g.value(g.get("w")).grad, -1);
  EXPECT_FALSE(g.find("w@grad").has_value());
  for (const graph::Node& n : g.nodes()) {
    for (size_t k = 0; k < n.inputs.size() && n.kind == graph::NodeKind::Backward; ++k) {
      if (n.inputs[k] == g.get("w") && k < g.node(n.forward).inputs.size()) { EXPECT_EQ(n.outputs[k], -1) << n.to_string(g); }
    }
  }
  std::map<std::string, Tensor> data = {{"x", random(Shape{4, 3}, 11)},
                                        {"w", random(Shape{3, 5}, 12)},
                                        {"lora_A", random(Shape{2, 3}, 13)},
                                        {"lora_B", random(Shape{5, 2}, 14)}};
  mesh::ProcessMesh one(Shape{1});
  auto result = run_graph(build_adapted, one, data, "loss", {"loss"});
  EXPECT_EQ(result.grads.count("w"), 0u);
  for (const char* p : {"lora_A", "lora_B"}) {
    Tensor grad = result.grads.at(p);
    for (int64_t i = 0; i < grad.numel(); ++i) {
      auto loss_with = [&](double delta) {
        auto d = data;
        d[p] = data[p].clone();
        d[p].set_at(i, data[p].at(i) + delta);
        return run_graph(build_adapted, one, d, "loss", {"loss"}).values.at("loss").at(0);
      };
      double numeric = (loss_with(1e-6) - loss_with(-1e-6)) / 2e-6;
      EXPECT_NEAR(grad.at(i), numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << p << " element " << i;
    }
  }
}

// The fused LM head with its gradients formed in the forward (two outputs that carry no gradient,
// OpDef::grad_outputs): their gradient slots hold the outputs themselves, no zero fill of their
// size is added, and the parameters' gradients equal the unfused matmul + cross_entropy graph's.
void build_head(graph::Graph& g, bool fused) {
  auto x = g.input("x", Shape{6, 3}, DType::F64);
  auto labels = g.input("labels", Shape{6}, DType::I64);
  auto w1 = g.param("w1", Shape{3, 4}, DType::F64);
  auto head = g.param("head", Shape{9, 4}, DType::F64);
  auto h = g.matmul(x, w1, false, "h");
  Attrs a{{"reduction", std::string("sum")}};
  if (fused) a.set("forward_grads", int64_t{3}), a.set("grad_scale", 0.25);
  auto total = fused ? g.op1("lm_head_cross_entropy", {h, head, labels}, a, "total")
                     : g.op1("cross_entropy", {g.matmul(h, head, true, "logits"), labels}, a, "total");
  g.scale(total, 0.25, 0.0, "loss");
}

TEST(Autodiff, OutputsWithoutAGradientStandInForTheirOwnAndAddNoFill) {
  graph::Graph g;
  build_head(g, true);
  graph::append_backward(g, g.get("loss"));
  int backward_nodes = 0;
  for (const graph::Node& n : g.nodes()) {
    if (n.kind == graph::NodeKind::Fill) {
      EXPECT_NE(g.value(n.outputs[0]).meta.shape, (Shape{9, 4})) << "a fill of dW's size";
    }
    if (n.kind != graph::NodeKind::Backward || n.op != "lm_head_cross_entropy") continue;
    ++backward_nodes;
    ASSERT_EQ(n.inputs.size(), 9u);  // h, W, labels, 3 outputs, 3 output grads
    EXPECT_EQ(n.inputs[7], g.get("total:1"));
    EXPECT_EQ(n.inputs[8], g.get("total:2"));
    EXPECT_NE(n.inputs[6], g.get("total"));  // the loss's gradient is a real one
  }
  EXPECT_EQ(backward_nodes, 1);
  std::map<std::string, Tensor> data = {{"x", random(Shape{6, 3}, 11)}, {"w1", random(Shape{3, 4}, 12)},
                                        {"head", random(Shape{9, 4}, 13)},
                                        {"labels", Tensor::from<int64_t>({6}, std::vector<int64_t>{3, 8, 0, 5, 5, 1})}};
  mesh::ProcessMesh one(Shape{1});
  auto fused = run_graph([](graph::Graph& gr) { build_head(gr, true); }, one, data, "loss", {"loss"});
  auto plain = run_graph([](graph::Graph& gr) { build_head(gr, false); }, one, data, "loss", {"loss"});
  EXPECT_NEAR(fused.values.at("loss").at(0), plain.values.at("loss").at(0), 1e-12);
  for (const char* p : {"w1", "head"}) {
    const Tensor& a = fused.grads.at(p);
    const Tensor& b = plain.grads.at(p);
    ASSERT_EQ(a.shape(), b.shape()) << p;
    for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.at(i), b.at(i), 1e-12) << p << " element " << i;
  }
}

TEST(Builder, ShapeMismatchAndUnknownOpNameTheNode) {
  graph::Graph g;
  auto x = g.input("x", Shape{2, 3});
  auto w = g.param("w", Shape{4, 5});
  try {
    g.matmul(x, w, false, "h");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'h' (matmul(x 2x3, w 4x5))"), std::string::npos) << e.what();
  }
  try {
    g.op1("no_such_op", {x});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown op 'no_such_op'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.input("x", Shape{1}), Error);  // names are unique
  try {
    g.annotate(x, "S(2),R");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("annotation of 'x'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardwise
