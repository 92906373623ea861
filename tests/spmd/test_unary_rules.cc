// Explicit expectations for the unary elementwise rules (the verifier proves them numerically).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

ProcessMesh mesh_of(std::initializer_list<int64_t> dims) { return ProcessMesh(Shape(dims)); }

TensorSpec spec(Shape shape, std::string_view dist, DType dtype = DType::F64) {
  return TensorSpec{shape, dtype, parse_dist(dist)};
}

struct Forward {
  std::string in, out;
};
Forward forward(std::string_view rule, const ProcessMesh& m, const TensorSpec& x, const Attrs& attrs = {}) {
  std::vector<TensorSpec> inputs = {x};
  SpmdResult r = rules().get(rule).forward(m, inputs, attrs);
  EXPECT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return {r.inputs[0].to_string(), r.outputs[0].to_string()};
}

Forward reverse(std::string_view rule, const ProcessMesh& m, const TensorSpec& x, const TensorSpec& wanted,
                const Attrs& attrs = {}) {
  std::vector<TensorSpec> inputs = {x}, outputs = {wanted};
  SpmdResult r = rules().get(rule).reverse(m, inputs, outputs, attrs);
  EXPECT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return {r.inputs[0].to_string(), r.outputs[0].to_string()};
}

// Grad: returns "x | out | dy -> dx".
std::string grad(std::string_view rule, const ProcessMesh& m, const TensorSpec& x, const TensorSpec& out,
                 const TensorSpec& dy, const Attrs& attrs = {}) {
  std::vector<TensorSpec> g = {x, out, dy};
  SpmdResult r = rules().get(rule).grad(m, g, attrs);
  EXPECT_EQ(r.inputs.size(), 3u);
  EXPECT_EQ(r.outputs.size(), 1u);
  return r.inputs[0].to_string() + " | " + r.inputs[1].to_string() + " | " + r.inputs[2].to_string() + " -> " +
         r.outputs[0].to_string();
}

Attrs scale_attrs(double s, double b, bool after = true) {
  return Attrs{{"scale", s}, {"bias", b}, {"bias_after_scale", after}};
}
Attrs cast_to(const char* dtype) { return Attrs{{"dtype", std::string(dtype)}}; }

const ProcessMesh k2 = mesh_of({2});
const ProcessMesh k22 = mesh_of({2, 2});
const ProcessMesh k23 = mesh_of({2, 3});

TEST(UnaryRules, AllRegisteredInTheElementwiseFamily) {
  for (const char* name : {"elementwise_unary", "elementwise_unary_monotone", "neg", "scale", "cast"}) {
    const Rule* r = rules().find(name);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_EQ(r->family, "elementwise");
    EXPECT_FALSE(r->summary.empty());
  }
}

TEST(UnaryRules, NonLinearKeepsShardsAndReplicatesPartials) {
  Forward f = forward("elementwise_unary", k22, spec({12, 6}, "S(1),P(sum)"));
  EXPECT_EQ(f.in, "S(1),R");
  EXPECT_EQ(f.out, "S(1),R");
  for (const char* p : {"P(sum)", "P(avg)", "P(max)", "P(min)"}) {
    Forward g = forward("elementwise_unary", k2, spec({12}, p));
    EXPECT_EQ(g.in, "R") << p;
    EXPECT_EQ(g.out, "R") << p;
  }
  // The co-shard order is kept: mesh dim 1 splits dim 0 first, then mesh dim 0.
  Forward c = forward("elementwise_unary", k23, spec({12, 6}, "S(0)@1,S(0)@0"));
  EXPECT_EQ(c.in, "S(0)@1,S(0)@0");
  EXPECT_EQ(c.out, "S(0)@1,S(0)@0");
}

TEST(UnaryRules, MonotoneKeepsMaxAndMin) {
  // exp of P(sum) needs Replicate; of P(max) stays P(max).
  Forward f = forward("elementwise_unary_monotone", k22, spec({12, 6}, "P(sum),S(0)"));
  EXPECT_EQ(f.in, "R,S(0)");
  EXPECT_EQ(f.out, "R,S(0)");
  Forward g = forward("elementwise_unary_monotone", k22, spec({12, 6}, "P(max),P(min)"));
  EXPECT_EQ(g.in, "P(max),P(min)");
  EXPECT_EQ(g.out, "P(max),P(min)");
  EXPECT_EQ(forward("elementwise_unary_monotone", k2, spec({12}, "P(avg)")).out, "R");
}

TEST(UnaryRules, NegSwapsMaxAndMin) {
  Forward f = forward("neg", k22, spec({12, 6}, "P(max),S(0)"));
  EXPECT_EQ(f.in, "P(max),S(0)");
  EXPECT_EQ(f.out, "P(min),S(0)");
  EXPECT_EQ(forward("neg", k22, spec({12, 6}, "P(sum),P(avg)")).out, "P(sum),P(avg)");
  EXPECT_EQ(forward("neg", k2, spec({12}, "P(min)")).out, "P(max)");
  // Integers wrap around (-(-128) == -128 in i8): only P(sum) passes.
  Forward i = forward("neg", k22, spec({12, 6}, "P(max),P(sum)", DType::I8));
  EXPECT_EQ(i.in, "R,P(sum)");
  EXPECT_EQ(i.out, "R,P(sum)");
  EXPECT_EQ(forward("neg", k2, spec({12}, "P(avg)", DType::I32)).out, "R");
}

TEST(UnaryRules, ScaleExactnessConditions) {
  TensorSpec sum = spec({12}, "P(sum)"), avg = spec({12}, "P(avg)"), mx = spec({12}, "P(max)");
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(2, 0.5)).out, "R");       // affine part
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(2, 0)).out, "P(sum)");    // linear
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(2, 1, false)).out, "R");  // 2 (x + 1)
  EXPECT_EQ(forward("scale", k2, sum, scale_attrs(0, 1, false)).out, "P(sum)");  // 0 (x + 1) == 0
  EXPECT_EQ(forward("scale", k2, sum, Attrs{}).out, "P(sum)");              // defaults: identity
  EXPECT_EQ(forward("scale", k2, avg, scale_attrs(-3, 7)).out, "P(avg)");
  EXPECT_EQ(forward("scale", k2, mx, scale_attrs(2, 7)).out, "P(max)");
  EXPECT_EQ(forward("scale", k2, mx, scale_attrs(-2, 7)).out, "P(min)");
  EXPECT_EQ(forward("scale", k2, mx, scale_attrs(0, 7)).out, "P(max)");
  // Integers: P(sum) iff no bias; P(avg) never; P(max) only for a constant output.
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(sum)", DType::I32), scale_attrs(3, 0)).out, "P(sum)");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(sum)", DType::I32), scale_attrs(3, 1)).out, "R");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(avg)", DType::I32), scale_attrs(1, 0)).out, "R");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(max)", DType::I32), scale_attrs(2, 0)).out, "R");
  EXPECT_EQ(forward("scale", k2, spec({12}, "P(max)", DType::I32), scale_attrs(0, 4)).out, "P(max)");
}

TEST(UnaryRules, CastExactnessConditions) {
  EXPECT_EQ(forward("cast", k22, spec({12, 6}, "P(sum),P(max)"), cast_to("f32")).out, "P(sum),P(max)");
  EXPECT_EQ(forward("cast", k22, spec({12, 6}, "P(avg),S(1)", DType::F32), cast_to("bf16")).out, "P(avg),S(1)");
  // Widening: f32 parts summed in f64 are not the f32 sum widened; max/min stay exact.
  Forward fw = forward("cast", k22, spec({12, 6}, "P(avg),P(min)", DType::F32), cast_to("f64"));
  EXPECT_EQ(fw.in, "R,P(min)");
  EXPECT_EQ(fw.out, "R,P(min)");
  Forward fi = forward("cast", k22, spec({12, 6}, "P(sum),P(max)"), cast_to("i32"));
  EXPECT_EQ(fi.in, "R,P(max)");
  EXPECT_EQ(fi.out, "R,P(max)");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(max)"), cast_to("bool")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(min)", DType::I8), cast_to("i64")).out, "P(min)");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(min)", DType::I64), cast_to("i8")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(max)", DType::I8), cast_to("u8")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(sum)", DType::I32), cast_to("f64")).out, "R");
  EXPECT_EQ(forward("cast", k2, spec({12}, "P(sum)", DType::I32), cast_to("i32")).out, "P(sum)");
  EXPECT_THROW(forward("cast", k2, spec({12}, "R"), Attrs{}), Error);
  EXPECT_THROW(forward("cast", k2, spec({12}, "R"), cast_to("f128")), Error);
}

TEST(UnaryRules, ReverseMapsWantedPartialsBack) {
  TensorSpec x = spec({12, 6}, "R,R");
  Forward n = reverse("neg", k22, x, spec({12, 6}, "P(max),S(1)"));
  EXPECT_EQ(n.in, "P(min),S(1)");
  EXPECT_EQ(n.out, "P(max),S(1)");
  Forward e = reverse("elementwise_unary", k22, x, spec({12, 6}, "P(sum),S(0)"));
  EXPECT_EQ(e.in, "R,S(0)");
  EXPECT_EQ(e.out, "R,S(0)");
  Forward m = reverse("elementwise_unary_monotone", k22, x, spec({12, 6}, "P(min),P(avg)"));
  EXPECT_EQ(m.in, "P(min),R");
  EXPECT_EQ(m.out, "P(min),R");
  EXPECT_EQ(reverse("scale", k2, spec({12}, "R"), spec({12}, "P(sum)"), scale_attrs(2, 1)).out, "R");
  Forward s = reverse("scale", k2, spec({12}, "R"), spec({12}, "P(min)"), scale_attrs(-2, 1));
  EXPECT_EQ(s.in, "P(max)");
  EXPECT_EQ(s.out, "P(min)");
  Forward c = reverse("cast", k2, spec({12}, "R"), spec({12}, "P(max)", DType::I32), cast_to("i32"));
  EXPECT_EQ(c.in, "P(max)");
  EXPECT_EQ(reverse("cast", k2, spec({12}, "R"), spec({12}, "P(sum)", DType::I32), cast_to("i32")).out, "R");
  Forward co = reverse("elementwise_unary", k23, x, spec({12, 6}, "S(0)@1,S(0)@0"));
  EXPECT_EQ(co.in, "S(0)@1,S(0)@0");
}

TEST(UnaryRules, NonLinearGradMergesShardingsAndPassesLinearPartials) {
  // dy's shard on mesh dim 1 spreads to x and out; dy's P(sum) on mesh dim 0 passes (x, out R).
  EXPECT_EQ(grad("elementwise_unary", k22, spec({12, 6}, "R,R"), spec({12, 6}, "R,R"), spec({12, 6}, "P(sum),S(1)")),
            "R,S(1) | R,S(1) | P(sum),S(1) -> P(sum),S(1)");
  // x shards first: dy's Partial on that mesh dim is resharded to the shard.
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12, 6}, "S(0)"), spec({12, 6}, "R"), spec({12, 6}, "P(avg)")),
            "S(0) | S(0) | S(0) -> S(0)");
  // A Partial x is made Replicate; dy keeps its P(sum).
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12}, "P(sum)"), spec({12}, "R"), spec({12}, "P(sum)")),
            "R | R | P(sum) -> P(sum)");
  // P(max) dy is not linear-exact for a non-linear op.
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(max)")), "R | R | R -> R");
  // ... but it is for a non-decreasing op (f' >= 0).
  EXPECT_EQ(grad("elementwise_unary_monotone", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(max)")),
            "R | R | P(max) -> P(max)");
  // First tensor wins a conflict: x's S(0) over dy's S(1) on the same mesh dim.
  EXPECT_EQ(grad("elementwise_unary", k2, spec({12, 6}, "S(0)"), spec({12, 6}, "R"), spec({12, 6}, "S(1)")),
            "S(0) | S(0) | S(0) -> S(0)");
}

TEST(UnaryRules, LinearGradsIgnoreXAndMapDy) {
  EXPECT_EQ(grad("neg", k22, spec({12, 6}, "P(sum),R"), spec({12, 6}, "S(0),R"), spec({12, 6}, "P(max),S(1)")),
            "P(sum),R | S(0),R | P(max),S(1) -> P(min),S(1)");
  // scale's gradient s dy has no bias: P(sum) passes even with a bias.
  EXPECT_EQ(grad("scale", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(sum)"), scale_attrs(2, 5)),
            "R | R | P(sum) -> P(sum)");
  EXPECT_EQ(grad("scale", k2, spec({12}, "R"), spec({12}, "R"), spec({12}, "P(max)"), scale_attrs(-2, 5)),
            "R | R | P(max) -> P(min)");
  // cast f32 -> f64: dx = dy (f64) cast back to f32, a narrowing float cast: P(sum) passes.
  EXPECT_EQ(grad("cast", k2, spec({12}, "R", DType::F32), spec({12}, "R"), spec({12}, "P(sum)"), cast_to("f64")),
            "R | R | P(sum) -> P(sum)");
  // cast f64 -> f32: dx = dy (f32) widened to f64: P(sum) is resharded, P(min) passes.
  EXPECT_EQ(grad("cast", k22, spec({12, 6}, "R,R"), spec({12, 6}, "R,R", DType::F32),
                 spec({12, 6}, "P(sum),P(min)", DType::F32), cast_to("f32")),
            "R,R | R,R | R,P(min) -> R,P(min)");
  // cast f64 -> i32: dx = cast(dy i32 -> f64): P(sum) is resharded, P(max) passes.
  EXPECT_EQ(grad("cast", k22, spec({12, 6}, "R,R"), spec({12, 6}, "R,R", DType::I32),
                 spec({12, 6}, "P(sum),P(max)", DType::I32), cast_to("i32")),
            "R,R | R,R | R,P(max) -> R,P(max)");
}

TEST(UnaryRules, ErrorsNameTheRule) {
  std::vector<TensorSpec> two = {spec({12}, "R"), spec({12}, "R")};
  try {
    rules().get("elementwise_unary").forward(k2, two, Attrs{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("elementwise_unary"), std::string::npos) << e.what();
  }
  std::vector<TensorSpec> g = {spec({12}, "R"), spec({12}, "R"), spec({6}, "R")};
  EXPECT_THROW(rules().get("elementwise_unary").grad(k2, g, Attrs{}), Error);
  std::vector<TensorSpec> bad = {spec({12}, "S(1)")};
  EXPECT_THROW(rules().get("neg").forward(k2, bad, Attrs{}), Error);
}

}  // namespace
}  // namespace shardwise::spmd
