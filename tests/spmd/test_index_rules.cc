// Rules "index_select", "gather", "scatter_add", "embedding", "index_put": explicit expected
// distributions for forward, reverse and grad on a 2x2 mesh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::spmd {
namespace {

using mesh::parse_dist;

const ProcessMesh& mesh22() {
  static const ProcessMesh m(Shape{2, 2});
  return m;
}

TensorSpec spec(Shape shape, const char* dist, DType dtype = DType::F64) { return {shape, dtype, parse_dist(dist, 2)}; }
TensorSpec ids(Shape shape, const char* dist) { return spec(shape, dist, DType::I64); }

Attrs axis(int64_t a) {
  Attrs attrs;
  attrs.set("axis", a);
  return attrs;
}
Attrs accumulate(bool on) {
  Attrs attrs;
  attrs.set("accumulate", on);
  return attrs;
}

std::string show(const std::vector<DistAttr>& dists) {
  std::string out;
  for (const auto& d : dists) out += "[" + d.to_string() + "] ";
  return out;
}

void expect_dists(const std::vector<DistAttr>& got, const std::vector<const char*>& want, const char* what,
                  const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << what << " count, " << context;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], parse_dist(want[i], 2)) << what << " " << i << ": got " << show(got) << " for " << context;
  }
}

std::string given(const std::vector<TensorSpec>& in) {
  std::string out;
  for (const auto& t : in) out += t.shape.to_string() + "[" + t.dist.to_string() + "] ";
  return out;
}

void expect_forward(const char* rule, std::vector<TensorSpec> in, const Attrs& attrs, std::vector<const char*> inputs,
                    const char* out) {
  SpmdResult r = rules().get(rule).forward(mesh22(), in, attrs);
  expect_dists(r.inputs, inputs, "input", given(in));
  expect_dists(r.outputs, {out}, "output", given(in));
}

void expect_grad(const char* rule, std::vector<TensorSpec> in, const Attrs& attrs, std::vector<const char*> inputs,
                 std::vector<const char*> grads) {
  SpmdResult r = rules().get(rule).grad(mesh22(), in, attrs);
  expect_dists(r.inputs, inputs, "grad input", given(in));
  expect_dists(r.outputs, grads, "gradient", given(in));
}

void expect_reverse(const char* rule, std::vector<TensorSpec> in, TensorSpec out, const Attrs& attrs,
                    std::vector<const char*> inputs, const char* want_out) {
  std::vector<TensorSpec> outs = {out};
  SpmdResult r = rules().get(rule).reverse(mesh22(), in, outs, attrs);
  expect_dists(r.inputs, inputs, "input", "wanted " + out.dist.to_string());
  expect_dists(r.outputs, {want_out}, "output", "wanted " + out.dist.to_string());
}

TEST(IndexRules, Registered) {
  for (const char* name : {"index_select", "gather", "scatter_add", "embedding", "index_put"}) {
    const Rule& r = rules().get(name);
    EXPECT_EQ(r.family, "index") << name;
    EXPECT_FALSE(r.summary.empty()) << name;
  }
}

// ---- index_select --------------------------------------------------------------------------------

TEST(IndexSelectRule, Forward) {
  // x [12, 6] selected along axis 0 by index [5]. The other dim passes.
  expect_forward("index_select", {spec({12, 6}, "S(1),R"), ids({5}, "R,R")}, axis(0), {"S(1),R", "R,R"}, "S(1),R");
  // The indexed axis of x cannot stay sharded.
  expect_forward("index_select", {spec({12, 6}, "S(0),S(1)"), ids({5}, "R,R")}, axis(0), {"R,S(1)", "R,R"}, "R,S(1)");
  // A sharded index shards the output's axis.
  expect_forward("index_select", {spec({12, 6}, "R,S(1)"), ids({5}, "S(0),R")}, axis(0), {"R,S(1)", "S(0),R"},
                 "S(0),S(1)");
  // x wins a mesh dim both claim.
  expect_forward("index_select", {spec({12, 6}, "R,S(0)"), ids({5}, "S(0),S(0)")}, axis(1), {"R,S(0)", "S(0),R"},
                 "S(1),S(0)");
  // Partial x of any op passes on a free mesh dim; a Partial index is reduced.
  expect_forward("index_select", {spec({12, 6}, "P(max),P(sum)"), ids({5}, "R,P(sum)")}, axis(0),
                 {"P(max),P(sum)", "R,R"}, "P(max),P(sum)");
  // Sharding beats Partial: the index shards mesh dim 0, x's P(avg) there is reduced.
  expect_forward("index_select", {spec({12, 6}, "P(avg),R"), ids({5}, "S(0),R")}, axis(0), {"R,R", "S(0),R"},
                 "S(0),R");
}

TEST(IndexSelectRule, GradAndReverse) {
  // x [12, 6], index [5] sharded on mesh 0, dout [5, 6] S(0), S(1): dx P(sum) on mesh 0, S(1) on mesh 1.
  expect_grad("index_select",
              {spec({12, 6}, "R,R"), ids({5}, "S(0),R"), spec({5, 6}, "S(0),R"), spec({5, 6}, "S(0),S(1)")}, axis(0),
              {"R,S(1)", "S(0),R", "S(0),R", "S(0),S(1)"}, {"P(sum),S(1)", "R,R"});
  // dout P(avg) passes; P(max) is reduced. x's Partial is kept (x is only read for its shape).
  expect_grad("index_select",
              {spec({12, 6}, "P(min),R"), ids({5}, "R,R"), spec({5, 6}, "R,R"), spec({5, 6}, "P(avg),P(max)")},
              axis(0), {"P(min),R", "R,R", "R,R", "P(avg),R"}, {"P(avg),R", "R,R"});
  // Reverse: the wanted axis shard goes to the index, the other dim and the Partial to x.
  expect_reverse("index_select", {spec({12, 6}, "R,R"), ids({5}, "R,R")}, spec({5, 6}, "S(0),S(1)"), axis(0),
                 {"R,S(1)", "S(0),R"}, "S(0),S(1)");
  expect_reverse("index_select", {spec({12, 6}, "R,R"), ids({5}, "R,R")}, spec({5, 6}, "P(max),S(1)"), axis(0),
                 {"P(max),S(1)", "R,R"}, "P(max),S(1)");
}

// ---- gather ---------------------------------------------------------------------------------------

TEST(GatherRule, ForwardSharesOnlyEqualExtents) {
  // x [5, 4], index [6, 4], axis 0: dim 1 has equal extents (shared), the axis is R in x.
  expect_forward("gather", {spec({5, 4}, "S(0),S(1)"), ids({6, 4}, "R,R")}, axis(0), {"R,S(1)", "R,S(1)"}, "R,S(1)");
  // The index's axis may be sharded: the output follows.
  expect_forward("gather", {spec({5, 4}, "R,R"), ids({6, 4}, "S(0),S(1)")}, axis(0), {"R,S(1)", "S(0),S(1)"},
                 "S(0),S(1)");
  // x [4, 7], index [3, 5], axis 1: dim 0 extents differ (4 vs 3), so it is R in both.
  expect_forward("gather", {spec({4, 7}, "S(0),R"), ids({3, 5}, "S(0),S(1)")}, axis(1), {"R,R", "R,S(1)"}, "R,S(1)");
  // Partial x passes where no letter is sharded.
  expect_forward("gather", {spec({5, 4}, "P(sum),P(min)"), ids({6, 4}, "R,R")}, axis(0), {"P(sum),P(min)", "R,R"},
                 "P(sum),P(min)");
}

TEST(GatherRule, GradAndReverse) {
  // index's axis sharded on mesh 0: dx P(sum) there; dim 1 shared, sharded on mesh 1.
  expect_grad("gather",
              {spec({5, 4}, "R,R"), ids({6, 4}, "S(0),S(1)"), spec({6, 4}, "S(0),S(1)"), spec({6, 4}, "R,R")},
              axis(0), {"R,S(1)", "S(0),S(1)", "S(0),S(1)", "S(0),S(1)"}, {"P(sum),S(1)", "R,R"});
  expect_reverse("gather", {spec({5, 4}, "R,R"), ids({6, 4}, "R,R")}, spec({6, 4}, "S(1),P(avg)"), axis(0),
                 {"S(1),P(avg)", "S(1),R"}, "S(1),P(avg)");
}

// ---- scatter_add ----------------------------------------------------------------------------------

TEST(ScatterAddRule, Forward) {
  // x [5, 4], index [6, 4], src [6, 4], axis 0: dim 1 shared by all three.
  expect_forward("scatter_add", {spec({5, 4}, "S(1),S(0)"), ids({6, 4}, "R,R"), spec({6, 4}, "R,R")}, axis(0),
                 {"S(1),R", "S(1),R", "S(1),R"}, "S(1),R");
  // src larger than index on dim 1 (axis 0): nothing shared.
  expect_forward("scatter_add", {spec({5, 4}, "S(1),R"), ids({6, 3}, "R,R"), spec({6, 4}, "R,R")}, axis(0),
                 {"R,R", "R,R", "R,R"}, "R,R");
  // x and src both P(sum) pass; P(sum) with R is reduced; P(max) never passes.
  expect_forward("scatter_add", {spec({5, 4}, "P(sum),P(sum)"), ids({6, 4}, "R,R"), spec({6, 4}, "P(sum),R")},
                 axis(0), {"P(sum),R", "R,R", "P(sum),R"}, "P(sum),R");
  expect_forward("scatter_add", {spec({5, 4}, "P(max),P(avg)"), ids({6, 4}, "R,R"), spec({6, 4}, "P(max),P(avg)")},
                 axis(0), {"R,P(avg)", "R,R", "R,P(avg)"}, "R,P(avg)");
}

TEST(ScatterAddRule, GradAndReverse) {
  // dx = dout, dsrc = gather(dout): both follow dout, any Partial of dout passes.
  expect_grad("scatter_add",
              {spec({5, 4}, "R,R"), ids({6, 4}, "R,R"), spec({6, 4}, "R,R"), spec({5, 4}, "R,R"),
               spec({5, 4}, "S(1),P(max)")},
              axis(0), {"S(1),R", "S(1),R", "S(1),R", "R,R", "S(1),P(max)"}, {"S(1),P(max)", "R,R", "S(1),P(max)"});
  expect_reverse("scatter_add", {spec({5, 4}, "R,R"), ids({6, 4}, "R,R"), spec({6, 4}, "R,R")},
                 spec({5, 4}, "P(avg),P(max)"), axis(0), {"P(avg),R", "R,R", "P(avg),R"}, "P(avg),R");
}

// ---- embedding ------------------------------------------------------------------------------------

TEST(EmbeddingRule, Forward) {
  // Vocab-parallel: weight S(0) on mesh 1 -> output Partial(sum) there; ids sharded on mesh 0.
  expect_forward("embedding", {ids({4, 6}, "S(0),R"), spec({12, 8}, "R,S(0)")}, {}, {"S(0),R", "R,S(0)"},
                 "S(0),P(sum)");
  // weight sharded on H: the output's last dim.
  expect_forward("embedding", {ids({4, 6}, "R,S(1)"), spec({12, 8}, "S(1),R")}, {}, {"R,S(1)", "S(1),R"},
                 "S(2),S(1)");
  // Conflict on mesh 0: the weight wins, the ids are resharded.
  expect_forward("embedding", {ids({4, 6}, "S(0),R"), spec({12, 8}, "S(0),R")}, {}, {"R,R", "S(0),R"}, "P(sum),R");
  // Vocab co-sharded over both mesh dims.
  expect_forward("embedding", {ids({4, 6}, "R,R"), spec({12, 8}, "S(0),S(0)")}, {}, {"R,R", "S(0),S(0)"},
                 "P(sum),P(sum)");
  // Partial weight (any op) passes on a free mesh dim; Partial ids are reduced.
  expect_forward("embedding", {ids({4, 6}, "P(sum),R"), spec({12, 8}, "P(max),S(0)")}, {}, {"R,R", "P(max),S(0)"},
                 "P(max),P(sum)");
}

TEST(EmbeddingRule, GradAndReverse) {
  // ids sharded on mesh 0: dweight Partial(sum) there; vocab shard on mesh 1 kept.
  expect_grad("embedding",
              {ids({4, 6}, "S(0),R"), spec({12, 8}, "R,S(0)"), spec({4, 6, 8}, "S(0),P(sum)"),
               spec({4, 6, 8}, "R,R")},
              {}, {"S(0),R", "R,S(0)", "S(0),P(sum)", "S(0),R"}, {"R,R", "P(sum),S(0)"});
  // dout P(avg) passes; the weight's own Partial is kept (its values are not read).
  expect_grad("embedding",
              {ids({4, 6}, "R,R"), spec({12, 8}, "P(min),S(1)"), spec({4, 6, 8}, "R,S(2)"),
               spec({4, 6, 8}, "P(avg),R")},
              {}, {"R,R", "P(min),S(1)", "R,S(2)", "P(avg),S(2)"}, {"R,R", "P(avg),S(1)"});
  // Reverse: a wanted Partial(sum) becomes a vocab shard; P(max) a Partial weight.
  expect_reverse("embedding", {ids({4, 6}, "R,R"), spec({12, 8}, "R,R")}, spec({4, 6, 8}, "P(sum),S(0)"), {},
                 {"R,S(0)", "S(0),R"}, "P(sum),S(0)");
  expect_reverse("embedding", {ids({4, 6}, "R,R"), spec({12, 8}, "R,R")}, spec({4, 6, 8}, "S(2),P(max)"), {},
                 {"R,R", "S(1),P(max)"}, "S(2),P(max)");
}

// ---- index_put ------------------------------------------------------------------------------------

TEST(IndexPutRule, Forward) {
  // k = 1: x's dim 0 is indexed (R), dim 1 passes with value [6, 4] sharded the same way.
  expect_forward("index_put", {spec({5, 4}, "S(0),S(1)"), ids({6}, "S(0),R"), spec({6, 4}, "R,R")}, {},
                 {"R,S(1)", "R,R", "R,S(1)"}, "R,S(1)");
  // value broadcast along x's dim 1 ([6, 1]): value stays R there.
  expect_forward("index_put", {spec({5, 4}, "R,S(1)"), ids({6}, "R,R"), spec({6, 1}, "R,R")}, {},
                 {"R,S(1)", "R,R", "R,R"}, "R,S(1)");
  // Partial, accumulate: both P(sum) pass; P(sum) with R does not.
  expect_forward("index_put", {spec({5, 4}, "P(sum),P(sum)"), ids({6}, "R,R"), spec({6, 4}, "P(sum),R")},
                 accumulate(true), {"P(sum),R", "R,R", "P(sum),R"}, "P(sum),R");
  // Partial, assignment: the same op on both passes, P(max) with R passes, P(sum) with R does not.
  expect_forward("index_put", {spec({5, 4}, "P(min),P(max)"), ids({6}, "R,R"), spec({6, 4}, "P(min),R")},
                 accumulate(false), {"P(min),P(max)", "R,R", "P(min),R"}, "P(min),P(max)");
  expect_forward("index_put", {spec({5, 4}, "P(sum),R"), ids({6}, "R,R"), spec({6, 4}, "R,P(max)")},
                 accumulate(false), {"R,R", "R,R", "R,P(max)"}, "R,P(max)");
  // k = 2: every dim of x is indexed.
  expect_forward("index_put", {spec({3, 4}, "S(0),S(1)"), ids({5}, "S(0),R"), ids({5}, "R,R"), spec({5}, "S(0),R")},
                 {}, {"R,R", "R,R", "R,R", "R,R"}, "R,R");
}

TEST(IndexPutRule, GradAndReverse) {
  // value [6, 1] broadcast along x's dim 1 sharded on mesh 1: dvalue Partial(sum) there.
  expect_grad("index_put",
              {spec({5, 4}, "R,S(1)"), ids({6}, "R,R"), spec({6, 1}, "R,R"), spec({5, 4}, "R,S(1)"),
               spec({5, 4}, "P(sum),S(1)")},
              {}, {"R,S(1)", "R,R", "R,R", "R,S(1)", "P(sum),S(1)"}, {"P(sum),S(1)", "R,R", "P(sum),P(sum)"});
  // value [6, 4]: dvalue follows dout's dim 1; dout's P(max) is reduced.
  expect_grad("index_put",
              {spec({5, 4}, "R,R"), ids({6}, "R,R"), spec({6, 4}, "R,R"), spec({5, 4}, "R,R"),
               spec({5, 4}, "S(1),P(max)")},
              accumulate(true), {"S(1),R", "R,R", "S(1),R", "R,R", "S(1),R"}, {"S(1),R", "R,R", "S(1),R"});
  // Reverse: assignment can produce P(max); accumulation cannot.
  expect_reverse("index_put", {spec({5, 4}, "R,R"), ids({6}, "R,R"), spec({6, 4}, "R,R")},
                 spec({5, 4}, "S(1),P(max)"), accumulate(false), {"S(1),P(max)", "R,R", "S(1),P(max)"},
                 "S(1),P(max)");
  expect_reverse("index_put", {spec({5, 4}, "R,R"), ids({6}, "R,R"), spec({6, 4}, "R,R")},
                 spec({5, 4}, "S(1),P(max)"), accumulate(true), {"S(1),R", "R,R", "S(1),R"}, "S(1),R");
}

TEST(IndexRules, Errors) {
  std::vector<TensorSpec> bad_axis = {spec({5, 4}, "R,R"), ids({3}, "R,R")};
  EXPECT_THROW(rules().get("index_select").forward(mesh22(), bad_axis, axis(2)), Error);
  std::vector<TensorSpec> bad_gather = {spec({5, 4}, "R,R"), ids({3, 5}, "R,R")};
  EXPECT_THROW(rules().get("gather").forward(mesh22(), bad_gather, axis(0)), Error);
  std::vector<TensorSpec> bad_weight = {ids({4}, "R,R"), spec({12}, "R,R")};
  EXPECT_THROW(rules().get("embedding").forward(mesh22(), bad_weight, {}), Error);
  std::vector<TensorSpec> bad_value = {spec({5, 4}, "R,R"), ids({6}, "R,R"), spec({3}, "R,R")};
  EXPECT_THROW(rules().get("index_put").forward(mesh22(), bad_value, {}), Error);
  std::vector<TensorSpec> too_few = {spec({5, 4}, "R,R"), ids({6}, "R,R")};
  EXPECT_THROW(rules().get("index_put").forward(mesh22(), too_few, {}), Error);
}

}  // namespace
}  // namespace shardwise::spmd
