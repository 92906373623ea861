// Rules of dropout, cumsum, arg_reduce (argmax/argmin) and topk against hand-derived
// expectations (forward, reverse, grad).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

// "required inputs | outputs", each list joined by "; ".
std::string show(const SpmdResult& r) {
  std::string s;
  for (size_t i = 0; i < r.inputs.size(); ++i) s += (i ? "; " : "") + r.inputs[i].to_string();
  s += " | ";
  for (size_t i = 0; i < r.outputs.size(); ++i) s += (i ? "; " : "") + r.outputs[i].to_string();
  return s;
}

struct T {
  Shape shape;
  DType dtype;
  std::string dist;
};

std::vector<TensorSpec> specs(const ProcessMesh& mesh, const std::vector<T>& ts) {
  std::vector<TensorSpec> out;
  for (const T& t : ts) out.push_back({t.shape, t.dtype, parse_dist(t.dist, mesh.ndim())});
  return out;
}

std::string fwd(std::string_view rule, const ProcessMesh& mesh, const std::vector<T>& in, const Attrs& attrs) {
  return show(rules().get(rule).forward(mesh, specs(mesh, in), attrs));
}
std::string rev(std::string_view rule, const ProcessMesh& mesh, const std::vector<T>& in, const std::vector<T>& out,
                const Attrs& attrs) {
  return show(rules().get(rule).reverse(mesh, specs(mesh, in), specs(mesh, out), attrs));
}
std::string grad(std::string_view rule, const ProcessMesh& mesh, const std::vector<T>& in, const Attrs& attrs) {
  return show(rules().get(rule).grad(mesh, specs(mesh, in), attrs));
}

const DType F = DType::F64, U8 = DType::U8, I = DType::I64;
const ProcessMesh m1(Shape{2});
const ProcessMesh m2(Shape{2, 3});

Attrs drop() { return Attrs{{"p", 0.3}, {"seed", int64_t{1}}}; }
Attrs axis(int64_t a) { return Attrs{{"axis", a}}; }

TEST(MiscRules, RegisteredWithSummaries) {
  for (const char* name : {"dropout", "cumsum", "arg_reduce", "topk"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "misc");
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(MiscRules, DropoutKeepsShardsAndEveryPartial) {
  EXPECT_EQ(fwd("dropout", m2, {{{12, 6}, F, "S(0),S(1)"}}, drop()), "S(0),S(1) | S(0),S(1); S(0),S(1)");
  EXPECT_EQ(fwd("dropout", m2, {{{12, 6}, F, "S(1)@1,S(1)@0"}}, drop()),
            "S(1)@1,S(1)@0 | S(1)@1,S(1)@0; S(1)@1,S(1)@0");
  EXPECT_EQ(fwd("dropout", m2, {{{5, 7}, F, "P(sum),S(0)"}}, drop()), "P(sum),S(0) | P(sum),S(0); R,S(0)");
  EXPECT_EQ(fwd("dropout", m2, {{{5, 7}, F, "P(max),P(min)"}}, drop()), "P(max),P(min) | P(max),P(min); R,R");
  EXPECT_EQ(fwd("dropout", m1, {{{5, 7}, F, "P(avg)"}}, drop()), "P(avg) | P(avg); R");
}

TEST(MiscRules, DropoutReverseAndGrad) {
  // Wanted out S(0), mask S(1) on another mesh dim: both kept.
  EXPECT_EQ(rev("dropout", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "S(0),R"}, {{12, 6}, U8, "R,S(1)"}}, drop()),
            "S(0),S(1) | S(0),S(1); S(0),S(1)");
  // A wanted Partial out is made by a Partial x; the mask is R there.
  EXPECT_EQ(rev("dropout", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "P(sum),R"}, {{12, 6}, U8, "R,R"}}, drop()),
            "P(sum),R | P(sum),R; R,R");
  // Out wins a mesh dim both claim differently.
  EXPECT_EQ(rev("dropout", m1, {{{12, 6}, F, "R"}}, {{{12, 6}, F, "S(1)"}, {{12, 6}, U8, "S(0)"}}, drop()),
            "S(1) | S(1); S(1)");
  // grad: x, out, mask, dout, dmask -> dx. x's sharding wins; x, out untouched; dmask like mask.
  EXPECT_EQ(grad("dropout", m2,
                 {{{12, 6}, F, "S(0),P(sum)"},
                  {{12, 6}, F, "S(0),R"},
                  {{12, 6}, U8, "R,R"},
                  {{12, 6}, F, "S(1),P(max)"},
                  {{12, 6}, U8, "P(sum),R"}},
                 drop()),
            "S(0),P(sum); S(0),R; S(0),R; S(0),P(max); S(0),R | S(0),P(max)");
  // dout sharded where x is Partial: dout's shard wins that mesh dim.
  EXPECT_EQ(grad("dropout", m1,
                 {{{12, 6}, F, "P(avg)"}, {{12, 6}, F, "R"}, {{12, 6}, U8, "R"}, {{12, 6}, F, "S(1)"},
                  {{12, 6}, U8, "R"}},
                 drop()),
            "P(avg); R; S(1); S(1); S(1) | S(1)");
}

TEST(MiscRules, CumsumReplicatesTheAxisAndPassesLinearPartials) {
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(1)), "S(0),R | S(0),R");
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(-2)), "R,S(1) | R,S(1)");
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "P(sum),P(avg)"}}, axis(0)), "P(sum),P(avg) | P(sum),P(avg)");
  EXPECT_EQ(fwd("cumsum", m2, {{{12, 6}, F, "P(max),P(min)"}}, axis(0)), "R,R | R,R");
  EXPECT_THROW(fwd("cumsum", m1, {{{12, 6}, F, "R"}}, Attrs{}), Error);
  // Reverse: a wanted shard of the axis cannot be made; P(avg) can.
  EXPECT_EQ(rev("cumsum", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "S(1),P(avg)"}}, axis(1)), "R,P(avg) | R,P(avg)");
  EXPECT_EQ(rev("cumsum", m2, {{{12, 6}, F, "R,R"}}, {{{12, 6}, F, "S(0),P(max)"}}, axis(1)), "S(0),R | S(0),R");
  // Grad: dx = reverse cumsum(dout); x, out left as given.
  EXPECT_EQ(grad("cumsum", m2, {{{12, 6}, F, "S(1),P(max)"}, {{12, 6}, F, "S(0),R"}, {{12, 6}, F, "S(0),P(sum)"}},
                 axis(1)),
            "S(1),P(max); S(0),R; S(0),P(sum) | S(0),P(sum)");
  EXPECT_EQ(grad("cumsum", m1, {{{12, 6}, F, "S(0)"}, {{12, 6}, F, "R"}, {{12, 6}, F, "P(max)"}}, axis(1)),
            "S(0); R; S(0) | S(0)");
}

TEST(MiscRules, ArgReduceReplicatesTheAxisAndRenumbers) {
  Attrs keep{{"axis", int64_t{0}}, {"keepdim", true}};
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(0)), "R,S(1) | R,S(0)");
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "S(0),S(1)"}}, keep), "R,S(1) | R,S(1)");
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "S(0),S(1)"}}, axis(1)), "S(0),R | S(0),R");
  EXPECT_EQ(fwd("arg_reduce", m2, {{{12, 6}, F, "P(max),S(0)"}}, axis(1)), "R,S(0) | R,S(0)");
  EXPECT_EQ(rev("arg_reduce", m2, {{{4, 3, 5}, F, "R,R"}}, {{{4, 5}, I, "S(1),P(sum)"}}, axis(1)),
            "S(2),R | S(1),R");
  EXPECT_EQ(rev("arg_reduce", m2, {{{4, 3, 5}, F, "R,R"}}, {{{4, 1, 5}, I, "S(0),S(1)"}},
                Attrs{{"axis", int64_t{1}}, {"keepdim", true}}),
            "S(0),R | S(0),R");
  EXPECT_EQ(grad("arg_reduce", m1, {{{12, 6}, F, "S(0)"}, {{6}, I, "R"}, {{6}, I, "P(sum)"}}, axis(0)),
            "S(0); R; P(sum) | R");
}

TEST(MiscRules, TopkReplicatesTheAxis) {
  Attrs k2{{"k", int64_t{2}}};
  EXPECT_EQ(fwd("topk", m2, {{{12, 6}, F, "S(0),S(1)"}}, k2), "S(0),R | S(0),R; S(0),R");
  EXPECT_EQ(fwd("topk", m2, {{{12, 6}, F, "S(1),P(sum)"}}, Attrs{{"k", int64_t{2}}, {"axis", int64_t{0}}}),
            "S(1),R | S(1),R; S(1),R");
  EXPECT_EQ(rev("topk", m2, {{{12, 6}, F, "R,R"}}, {{{12, 2}, F, "S(1),P(max)"}, {{12, 2}, I, "R,S(0)"}}, k2),
            "R,S(0) | R,S(0); R,S(0)");
  // Grad: x, values, indices, dvalues, dindices -> dx.
  EXPECT_EQ(grad("topk", m2,
                 {{{12, 6}, F, "S(0),P(sum)"},
                  {{12, 2}, F, "P(avg),R"},
                  {{12, 2}, I, "R,R"},
                  {{12, 2}, F, "R,P(max)"},
                  {{12, 2}, I, "P(sum),R"}},
                 k2),
            "S(0),P(sum); P(avg),R; S(0),R; S(0),P(max); S(0),R | S(0),P(max)");
  EXPECT_EQ(grad("topk", m1,
                 {{{12, 6}, F, "S(1)"}, {{12, 2}, F, "R"}, {{12, 2}, I, "R"}, {{12, 2}, F, "S(0)"},
                  {{12, 2}, I, "R"}},
                 k2),
            "S(0); R; S(0); S(0); S(0) | S(0)");
}

}  // namespace
}  // namespace shardwise::spmd
