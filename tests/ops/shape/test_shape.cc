// The shape family: its kernels, SPMD rules and registry entries tested side by side.
//
// Shape-op kernels against hand-written arrays (NumPy results worked out by hand), index arithmetic
// (transpose), and hand-derived dimension groups and local shapes.
//
// Shape-op rules against hand-derived expectations (forward, reverse, grad), including the
// reshape rule's hard cases from the issue.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/op.h"
#include "shardwise/ops/shape/kernels.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_shape_ops.cc)
namespace kernel_tests {
namespace {

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }

Tensor iota(const Shape& s, DType dtype = DType::F64) {
  Tensor t(dtype, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_at(i, static_cast<double>(i));
  return t;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.at(i));
  return out;
}

// "in0-in1:out0-out1" per group.
std::string groups(const Shape& in, const Shape& out) {
  std::string s;
  const DimTransform t = reshape_transform(in, out);  // view() points into it: keep it alive
  for (const DimGroup& g : t.view()) {
    if (!s.empty()) s += ' ';
    s += std::to_string(g.in_begin) + "-" + std::to_string(g.in_end) + ":" + std::to_string(g.out_begin) + "-" +
         std::to_string(g.out_end);
  }
  return s;
}

Attrs ints(const char* name, std::vector<int64_t> v) { return Attrs{{name, std::move(v)}}; }

TEST(ShapeOps, ReshapeGroups) {
  // The issue's hard case: 1 pairs with 1, 512 splits into (2, 256), 4096 stays.
  EXPECT_EQ(groups({1, 512, 4096}, {1, 2, 256, 4096}), "0-1:0-1 1-2:1-3 2-3:3-4");
  EXPECT_EQ(groups({12, 6}, {72}), "0-2:0-1");
  EXPECT_EQ(groups({6, 4}, {4, 6}), "0-2:0-2");
  EXPECT_EQ(groups({2, 1, 3}, {6}), "0-3:0-1");
  // Unpaired extent-1 dims are their own groups: added, 1:1, removed.
  EXPECT_EQ(groups({5, 1}, {1, 5}), "0-0:0-1 0-1:1-2 1-2:2-2");
  EXPECT_EQ(groups({1, 6}, {6}), "0-1:0-0 1-2:0-1");
  EXPECT_EQ(groups({}, {1}), "0-0:0-1");
  EXPECT_EQ(groups({0, 4}, {4, 0}), "0-2:0-2");  // no elements: one group
  EXPECT_THROW(groups({2, 3}, {7}), Error);
}

TEST(ShapeOps, LocalReshapeShapes) {
  // Leftmost dim of a flatten sharded evenly: a contiguous chunk.
  EXPECT_EQ(local_reshape_shape({12, 6}, {72}, {6, 6}, "reshape"), (Shape{36}));
  // A split whose first piece takes the shard: 12 -> (3, 4) on mesh 3.
  EXPECT_EQ(local_reshape_shape({12, 6}, {3, 4, 6}, {4, 6}, "reshape"), (Shape{1, 4, 6}));
  // 1:1 uneven / empty shards are fine.
  EXPECT_EQ(local_reshape_shape({5, 1}, {1, 5}, {2, 1}, "reshape"), (Shape{1, 2}));
  EXPECT_EQ(local_reshape_shape({5, 12}, {5, 3, 4}, {0, 12}, "reshape"), (Shape{0, 3, 4}));
  // A non-leading dim of a group sharded, a removed extent-1 dim sharded, a chunk that does not divide.
  EXPECT_THROW(local_reshape_shape({12, 6}, {72}, {12, 3}, "reshape"), Error);
  EXPECT_THROW(local_reshape_shape({1, 6}, {6}, {0, 6}, "squeeze"), Error);
  EXPECT_THROW(local_reshape_shape({12, 6}, {3, 4, 6}, {6, 6}, "reshape"), Error);
  // Single entries, then a chunk, then whole dims: one contiguous range of the group.
  EXPECT_EQ(local_reshape_shape({2, 4, 3}, {24}, {1, 2, 3}, "reshape"), (Shape{6}));
  EXPECT_EQ(local_reshape_shape({24}, {2, 12}, {6}, "reshape"), (Shape{1, 6}));
  EXPECT_EQ(local_reshape_shape({24, 5}, {2, 3, 4, 5}, {2, 5}, "reshape"), (Shape{1, 1, 2, 5}));
  EXPECT_THROW(local_reshape_shape({2, 4, 3}, {24}, {2, 2, 3}, "reshape"), Error);
  EXPECT_THROW(local_reshape_shape({2, 4, 3}, {24}, {1, 2, 2}, "reshape"), Error);
}

TEST(ShapeOps, ReshapeShapeAndValues) {
  EXPECT_EQ(reshape_shape({12}, ints("shape", {-1, 3})), (Shape{4, 3}));
  EXPECT_EQ(reshape_shape({2, 0}, ints("shape", {0, 5})), (Shape{0, 5}));  // 0 is a plain extent
  EXPECT_THROW(reshape_shape({12}, ints("shape", {-1, -1})), Error);
  EXPECT_THROW(reshape_shape({5}, ints("shape", {2, -1})), Error);
  EXPECT_THROW(reshape_shape({2, 0}, ints("shape", {0, -1})), Error);  // -1 ambiguous
  EXPECT_THROW(reshape_shape({2, 3}, ints("shape", {7})), Error);
  EXPECT_THROW(reshape_shape({2, 3}, ints("shape", {-2, -3})), Error);
  EXPECT_THROW(reshape_shape({6}, Attrs{}), Error);
  Tensor y = reshape_local(iota({2, 6}), {2, 6}, {3, 4}, "reshape");
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  EXPECT_EQ(values(y), values(iota({12})));
}

TEST(ShapeOps, SqueezeUnsqueezeFlattenShapes) {
  EXPECT_EQ(squeeze_shape({1, 3, 1}, Attrs{}), (Shape{3}));
  EXPECT_EQ(squeeze_shape({1, 3, 1}, ints("axis", {})), (Shape{3}));
  EXPECT_EQ(squeeze_shape({1, 3, 1}, ints("axis", {-1})), (Shape{1, 3}));
  EXPECT_EQ(squeeze_shape({1, 3, 1}, Attrs{{"axis", int64_t{0}}}), (Shape{3, 1}));
  EXPECT_THROW(squeeze_shape({1, 3, 1}, ints("axis", {1})), Error);      // extent 3
  EXPECT_THROW(squeeze_shape({1, 3, 1}, ints("axis", {0, -3})), Error);  // twice
  EXPECT_THROW(squeeze_shape({1, 3}, ints("axis", {2})), Error);
  EXPECT_EQ(unsqueeze_shape({3, 4}, ints("axis", {0, -1})), (Shape{1, 3, 4, 1}));
  EXPECT_EQ(unsqueeze_shape({3, 4}, ints("axis", {1, 3})), (Shape{3, 1, 4, 1}));
  EXPECT_EQ(unsqueeze_shape({}, ints("axis", {0})), (Shape{1}));
  EXPECT_EQ(unsqueeze_shape({3}, ints("axis", {1, -1})), (Shape{3, 1, 1}));  // -1 is output dim 2
  EXPECT_THROW(unsqueeze_shape({3}, ints("axis", {1, -2})), Error);          // both output dim 1
  EXPECT_THROW(unsqueeze_shape({3}, ints("axis", {3})), Error);
  EXPECT_EQ(flatten_shape({2, 3, 4}, Attrs{}), (Shape{24}));
  EXPECT_EQ(flatten_shape({2, 3, 4}, Attrs{{"start_axis", int64_t{1}}}), (Shape{2, 12}));
  EXPECT_EQ(flatten_shape({2, 3, 4}, Attrs{{"start_axis", int64_t{0}}, {"stop_axis", int64_t{1}}}), (Shape{6, 4}));
  EXPECT_EQ(flatten_shape({}, Attrs{}), (Shape{1}));
  EXPECT_THROW(flatten_shape({2, 3, 4}, Attrs{{"start_axis", int64_t{2}}, {"stop_axis", int64_t{1}}}), Error);
}

TEST(ShapeOps, TransposeByIndexArithmetic) {
  Tensor x = iota({2, 3, 4});
  Perm perm = transpose_perm(x.shape(), ints("perm", {2, 0, 1}));
  Tensor y = transpose(x, perm);
  ASSERT_EQ(y.shape(), (Shape{4, 2, 3}));
  // y[i, j, k] = x[j, k, i] and x's flat index is j*12 + k*4 + i.
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 3; ++k) EXPECT_EQ(y.at(i * 6 + j * 3 + k), j * 12 + k * 4 + i);
    }
  }
  EXPECT_EQ(values(transpose(y, perm.inverse())), values(x));
  EXPECT_EQ(values(transpose(f64({2, 3}, {1, 2, 3, 4, 5, 6}), transpose_perm({2, 3}, ints("perm", {-1, 0})))),
            (std::vector<double>{1, 4, 2, 5, 3, 6}));
  Tensor b(DType::Bool, {2, 2});
  b.set_at(1, 1);  // [[0, 1], [0, 0]]
  EXPECT_EQ(values(transpose(b, transpose_perm(b.shape(), ints("perm", {1, 0})))), (std::vector<double>{0, 0, 1, 0}));
  EXPECT_EQ(transpose(Tensor(DType::I64, {0, 3}), transpose_perm({0, 3}, ints("perm", {1, 0}))).shape(), (Shape{3, 0}));
  EXPECT_THROW(transpose_perm({2, 3}, ints("perm", {0, 0})), Error);
  EXPECT_THROW(transpose_perm({2, 3}, ints("perm", {0})), Error);
  EXPECT_THROW(transpose_perm({2, 3}, Attrs{}), Error);
}

TEST(ShapeOps, ExpandValuesAndGradient) {
  Tensor x = f64({3, 1}, {1, 2, 3});
  Shape out = expand_shape(x.shape(), ints("shape", {2, 3, 2}));
  ASSERT_EQ(out, (Shape{2, 3, 2}));
  EXPECT_EQ(values(expand_local(x, x.shape(), out)), (std::vector<double>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(expand_shape({3, 1}, ints("shape", {-1, 4})), (Shape{3, 4}));
  EXPECT_EQ(expand_shape({3, 1}, ints("shape", {3, 0})), (Shape{3, 0}));
  EXPECT_THROW(expand_shape({3, 2}, ints("shape", {3, 4})), Error);
  EXPECT_THROW(expand_shape({3, 2}, ints("shape", {2})), Error);
  EXPECT_THROW(expand_shape({3}, ints("shape", {-1, 3})), Error);
  // dx[b] = sum over a, c of dout[a, b, c] = sum of (6a + 2b + c) = 8b + 14.
  Tensor dx = expand_backward_local(iota({2, 3, 2}), {3, 1}, out);
  EXPECT_EQ(dx.shape(), (Shape{3, 1}));
  EXPECT_EQ(values(dx), (std::vector<double>{14, 22, 30}));
  // A shard: rows 2..3 of a [4,1] input expanded to [4,3] keep their local extent.
  Tensor shard = expand_local(f64({2, 1}, {7, 8}), {4, 1}, {4, 3});
  EXPECT_EQ(values(shard), (std::vector<double>{7, 7, 7, 8, 8, 8}));
  // The broadcast dim held in chunks (dout sharded there): each rank sums its block.
  EXPECT_EQ(values(expand_backward_local(f64({2, 1}, {4, 5}), {1, 1}, {4, 1})), (std::vector<double>{9}));
  EXPECT_EQ(values(expand_backward_local(Tensor(DType::F64, {0, 1}), {1, 1}, {4, 1})), (std::vector<double>{0}));
  // An identity expand still returns a fresh tensor.
  Tensor g = f64({2}, {1, 2});
  Tensor same = expand_backward_local(g, {2}, {2});
  EXPECT_NE(same.raw(), g.raw());
  EXPECT_EQ(values(same), values(g));
}

TEST(ShapeOps, ConcatSplitStack) {
  Tensor a = f64({2, 2}, {1, 2, 3, 4}), b = f64({2, 1}, {5, 6});
  std::vector<Tensor> ab = {a, b};
  Tensor c = concat(ab, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(values(c), (std::vector<double>{1, 2, 5, 3, 4, 6}));
  std::vector<int64_t> sizes = {2, 1};
  std::vector<Tensor> back = split(c, 1, sizes);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(values(back[0]), values(a));
  EXPECT_EQ(values(back[1]), values(b));
  std::vector<Tensor> bad = {a, f64({3, 1}, {1, 2, 3})};
  EXPECT_THROW(concat(bad, 1), Error);
  std::vector<Tensor> mixed = {a, Tensor(DType::F32, {2, 1})};
  EXPECT_THROW(concat(mixed, 1), Error);
  std::vector<Tensor> with_empty = {a, Tensor(DType::F64, {2, 0})};
  EXPECT_EQ(values(concat(with_empty, 1)), values(a));

  EXPECT_EQ(split_sizes({10}, Attrs{{"sections", std::vector<int64_t>{3, -1, 2}}}), (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(split_sizes({4, 10}, Attrs{{"axis", int64_t{1}}, {"num", int64_t{5}}}), (std::vector<int64_t>(5, 2)));
  EXPECT_EQ(split_count({10}, Attrs{{"sections", std::vector<int64_t>{10, 0}}}), 2);
  EXPECT_THROW(split_count({10}, Attrs{{"num", int64_t{3}}}), Error);
  EXPECT_THROW(split_count({10}, Attrs{{"num", int64_t{2}}, {"sections", std::vector<int64_t>{5, 5}}}), Error);
  EXPECT_THROW(split_count({10}, Attrs{{"sections", std::vector<int64_t>{3, 3}}}), Error);
  EXPECT_THROW(split_count({10}, Attrs{{"sections", std::vector<int64_t>{-1, -1}}}), Error);
  EXPECT_THROW(split_count({10}, Attrs{}), Error);

  Tensor p = f64({3}, {1, 2, 3}), q = f64({3}, {4, 5, 6});
  std::vector<Tensor> pq = {p, q};
  EXPECT_EQ(values(stack(pq, 1)), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  Tensor s0 = stack(pq, 0);
  EXPECT_EQ(s0.shape(), (Shape{2, 3}));
  EXPECT_EQ(values(s0), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  std::vector<Tensor> un = unstack(stack(pq, 1), 1);
  ASSERT_EQ(un.size(), 2u);
  EXPECT_EQ(un[1].shape(), (Shape{3}));
  EXPECT_EQ(values(un[1]), values(q));
  EXPECT_EQ(stack_axis(Attrs{{"axis", int64_t{-1}}}, 1), 1);
  EXPECT_THROW(stack_axis(Attrs{{"axis", int64_t{3}}}, 1), Error);
  std::vector<Tensor> unequal = {p, f64({2}, {1, 2})};
  EXPECT_THROW(stack(unequal, 0), Error);
}

Attrs cut(std::vector<int64_t> axes, std::vector<int64_t> starts, std::vector<int64_t> ends) {
  return Attrs{{"axes", std::move(axes)}, {"starts", std::move(starts)}, {"ends", std::move(ends)}};
}

TEST(ShapeOps, SliceBoundsValuesAndGradient) {
  SliceBounds b = slice_bounds({5, 7}, cut({0, 1}, {1, -4}, {100, 6}));
  EXPECT_EQ(b.out, (Shape{4, 3}));
  EXPECT_EQ(b.start[0], 1);
  EXPECT_EQ(b.start[1], 3);
  EXPECT_EQ(b.sliced, 3u);
  EXPECT_EQ(slice_bounds({5, 7}, cut({1}, {-9}, {7})).sliced, 0u);  // the whole range: not cut
  EXPECT_EQ(slice_bounds({5, 7}, cut({0}, {3}, {1})).out, (Shape{0, 7}));
  EXPECT_EQ(slice_bounds({5, 7}, cut({0}, {-100}, {-100})).out, (Shape{0, 7}));
  EXPECT_THROW(slice_bounds({5, 7}, cut({0, 0}, {1, 1}, {2, 2})), Error);
  EXPECT_THROW(slice_bounds({5, 7}, cut({0}, {1, 2}, {2})), Error);
  Attrs stepped = cut({0}, {0}, {4});
  stepped.set("steps", std::vector<int64_t>{2});
  EXPECT_THROW(slice_bounds({5, 7}, stepped), Error);

  Attrs attrs = cut({1}, {1}, {-1});
  Tensor y = slice_local(iota({3, 4}), {3, 4}, attrs);
  EXPECT_EQ(values(y), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  Tensor dx = slice_backward_local(f64({3, 2}, {1, 2, 3, 4, 5, 6}), {3, 4}, attrs);
  EXPECT_EQ(values(dx), (std::vector<double>{0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0}));
  // A shard (rows 1..2 of 3) of an uncut dim stays a shard; a cut dim must be whole.
  EXPECT_EQ(values(slice_local(f64({2, 4}, {4, 5, 6, 7, 8, 9, 10, 11}), {3, 4}, attrs)),
            (std::vector<double>{5, 6, 9, 10}));
  EXPECT_THROW(slice_local(f64({3, 2}, {0, 1, 2, 3, 4, 5}), {3, 4}, attrs), Error);
}

TEST(ShapeOps, TileValuesAndGradient) {
  Tensor x = f64({2, 2}, {1, 2, 3, 4});
  Attrs r23 = ints("repeat_times", {2, 3});
  Tensor y = tile_local(x, x.shape(), r23);
  ASSERT_EQ(y.shape(), (Shape{4, 6}));
  std::vector<double> row0 = {1, 2, 1, 2, 1, 2}, row1 = {3, 4, 3, 4, 3, 4}, want;
  for (int k = 0; k < 2; ++k)
    want.insert(want.end(), row0.begin(), row0.end()), want.insert(want.end(), row1.begin(), row1.end());
  EXPECT_EQ(values(y), want);
  // A short list pads with leading 1s; a long one adds leading dims.
  EXPECT_EQ(values(tile_local(x, x.shape(), ints("repeat_times", {2}))), (std::vector<double>{1, 2, 1, 2, 3, 4, 3, 4}));
  Tensor z = tile_local(x, x.shape(), ints("repeat_times", {2, 1, 1}));
  EXPECT_EQ(z.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values(z), (std::vector<double>{1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_EQ(tile_spec({2, 2}, ints("repeat_times", {0, 1})).out, (Shape{0, 2}));
  EXPECT_THROW(tile_spec({2, 2}, ints("repeat_times", {-1, 1})), Error);
  // dx[i, j] = dout[i, j] + dout[i, j + 2].
  Tensor dx = tile_backward_local(f64({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}), {2, 2}, ints("repeat_times", {1, 2}));
  EXPECT_EQ(values(dx), (std::vector<double>{2, 4, 10, 12}));
  // Leading dim summed; an integer gradient sums exactly.
  Tensor di = tile_backward_local(iota({3, 2}, DType::I64), {2}, ints("repeat_times", {3, 1}));
  EXPECT_EQ(di.dtype(), DType::I64);
  EXPECT_EQ(values(di), (std::vector<double>{6, 9}));
  // Shards: repeat-1 dims keep the local extent; a repeated dim must be whole.
  EXPECT_EQ(values(tile_local(f64({1, 2}, {3, 4}), {2, 2}, ints("repeat_times", {1, 2}))),
            (std::vector<double>{3, 4, 3, 4}));
  EXPECT_THROW(tile_local(f64({2, 1}, {1, 3}), {2, 2}, ints("repeat_times", {1, 2})), Error);
  EXPECT_THROW(tile_backward_local(Tensor(DType::Bool, {2, 4}), {2, 2}, ints("repeat_times", {1, 2})), Error);
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_shape_rules.cc)
namespace rule_tests {
using namespace spmd;
namespace {

using mesh::parse_dist;

struct In {
  Shape shape;
  const char* dist;
};

std::vector<TensorSpec> specs(const ProcessMesh& mesh, const std::vector<In>& ins, DType dtype = DType::F64) {
  std::vector<TensorSpec> out;
  for (const In& in : ins) out.push_back({in.shape, dtype, parse_dist(in.dist, mesh.ndim())});
  return out;
}

std::string join(const std::vector<DistAttr>& dists) {
  std::string s;
  for (const DistAttr& d : dists) s += (s.empty() ? "" : "; ") + d.to_string();
  return s;
}

std::string show(const SpmdResult& r) { return join(r.inputs) + " | " + join(r.outputs); }

// "required inputs | outputs"
std::string fwd(std::string_view rule, Shape mesh_shape, const std::vector<In>& ins, const Attrs& attrs) {
  ProcessMesh mesh(mesh_shape);
  return show(op_registry().rule(rule).forward(mesh, specs(mesh, ins), attrs));
}

// Reverse from wanted outputs (inputs Replicate, advisory).
std::string rev(std::string_view rule, Shape mesh_shape, const std::vector<Shape>& in_shapes,
                const std::vector<In>& outs, const Attrs& attrs) {
  ProcessMesh mesh(mesh_shape);
  std::vector<TensorSpec> in_specs;
  for (const Shape& s : in_shapes) in_specs.push_back({s, DType::F64, DistAttr(mesh.ndim())});
  return show(op_registry().rule(rule).reverse(mesh, in_specs, specs(mesh, outs), attrs));
}

// Grad: tensors = inputs ++ outputs ++ output grads; "required | input grads".
std::string grad(std::string_view rule, Shape mesh_shape, const std::vector<In>& tensors, const Attrs& attrs) {
  ProcessMesh mesh(mesh_shape);
  return show(op_registry().rule(rule).grad(mesh, specs(mesh, tensors), attrs));
}

Attrs shape_attr(std::vector<int64_t> s) { return Attrs{{"shape", std::move(s)}}; }

TEST(ShapeRules, AllRegisteredWithSummaries) {
  for (const char* name : {"reshape", "squeeze", "unsqueeze", "flatten", "transpose", "expand", "concat", "split",
                           "slice", "stack", "tile"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "shape") << name;
      }
    }
    EXPECT_FALSE(r.summary.empty());
  }
}

TEST(ShapeRules, ReshapeSplitMovesShardingToTheFirstPieceWhenItDivides) {
  // [1,512,4096] -> [1,2,256,4096]: 512 splits into (2, 256). The '2' divides mesh 2: S moves there.
  Attrs split = shape_attr({1, 2, 256, 4096});
  EXPECT_EQ(fwd("reshape", {2}, {{{1, 512, 4096}, "S(1)"}}, split), "S(1) | S(1)");
  // On mesh 3 the piece 2 does not divide: Replicate.
  EXPECT_EQ(fwd("reshape", {3}, {{{1, 512, 4096}, "S(1)"}}, split), "R | R");
  // 4096 maps 1:1 (to dim 3); the size-1 dim pairs 1:1 too.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{1, 512, 4096}, "S(2),S(1)"}}, split), "S(2),S(1) | S(3),S(1)");
  // Co-sharded 24 -> (2, 12): mesh dim 0 cuts the 2 into single entries, so mesh dim 1 goes on to
  // the 12 (a rank's 6 entries are one row's half: a contiguous range).
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{24}, "S(0),S(0)"}}, shape_attr({2, 12})), "S(0),S(0) | S(0),S(1)");
  // ... in the co-shard order given: mesh dim 1 first.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{24}, "S(0)@1,S(0)@0"}}, shape_attr({2, 12})), "S(0)@1,S(0)@0 | S(1),S(0)");
  // 24 -> (4, 6) on [2, 2]: the 4 is cut in 2s, not single entries: mesh dim 1 cannot go on.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{24}, "S(0),S(0)"}}, shape_attr({4, 6})), "S(0),S(0) | S(0),S(0)");
  EXPECT_EQ(fwd("reshape", {2, 3}, {{{24}, "S(0),S(0)"}}, shape_attr({2, 12})), "S(0),S(0) | S(0),S(1)");
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{24}, "S(0),S(0)"}}, shape_attr({2, 3, 4})), "S(0),R | S(0),R");
  // 12 -> (3, 4) keeps on mesh 3, not on mesh 2.
  EXPECT_EQ(fwd("reshape", {3}, {{{12, 6}, "S(0)"}}, shape_attr({3, 4, 6})), "S(0) | S(0)");
  EXPECT_EQ(fwd("reshape", {2}, {{{12, 6}, "S(0)"}}, shape_attr({3, 4, 6})), "R | R");
  // A 1:1 dim keeps uneven sharding: 5 stays 5.
  EXPECT_EQ(fwd("reshape", {2}, {{{5, 12}, "S(0)"}}, shape_attr({5, 3, 4})), "S(0) | S(0)");
}

TEST(ShapeRules, ReshapeFlattenKeepsLeftmostEvenSharding) {
  EXPECT_EQ(fwd("reshape", {2}, {{{12, 6}, "S(0)"}}, shape_attr({72})), "S(0) | S(0)");
  // Uneven leftmost dim: chunk boundaries do not line up -> Replicate.
  EXPECT_EQ(fwd("reshape", {2}, {{{5, 7}, "S(0)"}}, shape_attr({35})), "R | R");
  // Non-leftmost flattened dim: Replicate.
  EXPECT_EQ(fwd("reshape", {2}, {{{12, 6}, "S(1)"}}, shape_attr({72})), "R | R");
  // ... unless every dim left of it is cut into single entries ([C, B, S'] with C on cp, B on dp:
  // a rank holds one c and a chunk of B, one contiguous range): co-sharded in that order.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{2, 4, 3}, "S(1),S(0)"}}, shape_attr({24})), "S(1),S(0) | S(0)@1,S(0)@0");
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{2, 4, 3}, "S(0),S(1)"}}, shape_attr({24})), "S(0),S(1) | S(0),S(0)");
  // The leftmost dim cut in chunks of 2, not single entries: the next dim's sharding is dropped.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{4, 6}, "S(0),S(1)"}}, shape_attr({24})), "S(0),R | S(0),R");
  // A middle dim whole: the dim after it cannot stay sharded.
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{2, 3, 4}, "S(0),S(2)"}}, shape_attr({24})), "S(0),R | S(0),R");
  // A regroup 6x4 -> 4x6: both leftmost extents divide 2, not 3 (4 % 3).
  EXPECT_EQ(fwd("reshape", {2}, {{{6, 4}, "S(0)"}}, shape_attr({4, 6})), "S(0) | S(0)");
  EXPECT_EQ(fwd("reshape", {3}, {{{6, 4}, "S(0)"}}, shape_attr({4, 6})), "R | R");
  // A size-1 dim that disappears carries no sharding.
  EXPECT_EQ(fwd("reshape", {2}, {{{1, 12}, "S(0)"}}, shape_attr({12})), "R | R");
  EXPECT_EQ(fwd("reshape", {2}, {{{1, 12}, "S(1)"}}, shape_attr({12})), "S(1) | S(0)");
}

TEST(ShapeRules, ReshapePartialPassesAndReverseAndGrad) {
  EXPECT_EQ(fwd("reshape", {2, 2}, {{{12, 6}, "P(max),S(1)"}}, shape_attr({72})), "P(max),R | P(max),R");
  EXPECT_EQ(fwd("reshape", {2, 3}, {{{12, 6}, "S(0),P(avg)"}}, shape_attr({72})), "S(0),P(avg) | S(0),P(avg)");
  // Reverse: the wanted flatten sharding goes back to the leftmost dim.
  EXPECT_EQ(rev("reshape", {2}, {{12, 6}}, {{{72}, "S(0)"}}, shape_attr({72})), "S(0) | S(0)");
  EXPECT_EQ(rev("reshape", {2}, {{5, 7}}, {{{35}, "S(0)"}}, shape_attr({35})), "R | R");
  EXPECT_EQ(rev("reshape", {2, 2}, {{12, 6}}, {{{3, 4, 6}, "S(2),P(sum)"}}, shape_attr({3, 4, 6})),
            "S(1),P(sum) | S(2),P(sum)");
  EXPECT_EQ(rev("reshape", {3}, {{1, 512, 4096}}, {{{1, 2, 256, 4096}, "S(1)"}}, shape_attr({1, 2, 256, 4096})),
            "R | R");
  // Grad: dout [72] S(0) goes back to dx S(0); x and out keep their distributions.
  EXPECT_EQ(grad("reshape", {2, 2}, {{{12, 6}, "S(1),R"}, {{72}, "R,R"}, {{72}, "S(0),P(sum)"}}, shape_attr({72})),
            "S(1),R; R,R; S(0),P(sum) | S(0),P(sum)");
  EXPECT_EQ(grad("reshape", {2}, {{{5, 7}, "R"}, {{35}, "R"}, {{35}, "S(0)"}}, shape_attr({35})), "R; R; R | R");
  EXPECT_THROW(grad("reshape", {2}, {{{5, 7}, "R"}, {{35}, "R"}}, shape_attr({35})), Error);
}

TEST(ShapeRules, SqueezeUnsqueezeFlattenRenumber) {
  Attrs all_ones{{"axis", std::vector<int64_t>{}}};
  EXPECT_EQ(fwd("squeeze", {2, 3}, {{{1, 12, 1}, "S(1),P(min)"}}, all_ones), "S(1),P(min) | S(0),P(min)");
  // A "sharded" extent-1 dim that is squeezed away must be Replicate.
  EXPECT_EQ(fwd("squeeze", {2}, {{{5, 1, 7}, "S(1)"}}, Attrs{{"axis", std::vector<int64_t>{1}}}), "R | R");
  EXPECT_EQ(fwd("squeeze", {2}, {{{5, 1, 7}, "S(2)"}}, Attrs{{"axis", std::vector<int64_t>{1}}}), "S(2) | S(1)");
  EXPECT_EQ(fwd("unsqueeze", {2, 2}, {{{5, 7}, "S(1),S(0)"}}, Attrs{{"axis", std::vector<int64_t>{1, 3}}}),
            "S(1),S(0) | S(2),S(0)");
  Attrs mid{{"start_axis", int64_t{1}}, {"stop_axis", int64_t{2}}};
  EXPECT_EQ(fwd("flatten", {3}, {{{2, 6, 5}, "S(1)"}}, mid), "S(1) | S(1)");
  EXPECT_EQ(fwd("flatten", {3}, {{{2, 6, 5}, "S(2)"}}, mid), "R | R");
  EXPECT_EQ(fwd("flatten", {3}, {{{2, 6, 5}, "S(0)"}}, mid), "S(0) | S(0)");  // 1:1, uneven kept
  EXPECT_EQ(grad("flatten", {2}, {{{2, 6, 5}, "R"}, {{2, 30}, "R"}, {{2, 30}, "S(1)"}}, mid), "R; R; S(1) | S(1)");
}

TEST(ShapeRules, TransposeFollowsThePermutation) {
  Attrs perm{{"perm", std::vector<int64_t>{2, 0, 1}}};
  EXPECT_EQ(fwd("transpose", {2, 2}, {{{4, 6, 8}, "S(0),S(2)"}}, perm), "S(0),S(2) | S(1),S(0)");
  EXPECT_EQ(fwd("transpose", {2, 2}, {{{4, 6, 8}, "S(0)@1,S(0)@0"}}, perm), "S(0)@1,S(0)@0 | S(1)@1,S(1)@0");
  EXPECT_EQ(fwd("transpose", {2}, {{{4, 6, 8}, "P(avg)"}}, perm), "P(avg) | P(avg)");
  EXPECT_EQ(rev("transpose", {2, 2}, {{4, 6, 8}}, {{{8, 4, 6}, "S(0),P(sum)"}}, perm), "S(2),P(sum) | S(0),P(sum)");
  EXPECT_EQ(grad("transpose", {2, 2}, {{{4, 6, 8}, "R,R"}, {{8, 4, 6}, "R,R"}, {{8, 4, 6}, "S(0),P(sum)"}}, perm),
            "R,R; R,R; S(0),P(sum) | S(2),P(sum)");
}

TEST(ShapeRules, ExpandReplicatesBroadcastDims) {
  EXPECT_EQ(fwd("expand", {2}, {{{5, 1}, "S(0)"}}, shape_attr({5, 7})), "S(0) | S(0)");
  EXPECT_EQ(fwd("expand", {2}, {{{5, 1}, "S(1)"}}, shape_attr({5, 7})), "R | R");
  EXPECT_EQ(fwd("expand", {2, 2}, {{{3}, "S(0),P(sum)"}}, shape_attr({2, 3})), "S(0),P(sum) | S(1),P(sum)");
  // An extent-1 dim that stays 1 maps 1:1 and keeps even an empty-shard sharding.
  EXPECT_EQ(fwd("expand", {2}, {{{1, 5}, "S(0)"}}, shape_attr({1, 5})), "S(0) | S(0)");
  EXPECT_EQ(rev("expand", {2, 2}, {{1, 7}}, {{{4, 7}, "S(0),S(1)"}}, shape_attr({4, 7})), "R,S(1) | R,S(1)");
  // Grad: dout sharded on the broadcast dim -> dx P(sum) there.
  EXPECT_EQ(grad("expand", {2, 2}, {{{1, 7}, "R,R"}, {{4, 7}, "R,R"}, {{4, 7}, "S(0),S(1)"}}, shape_attr({4, 7})),
            "R,R; R,R; S(0),S(1) | P(sum),S(1)");
  // dout's P(max) cannot pass a sum, but passes when nothing is summed.
  EXPECT_EQ(grad("expand", {2}, {{{1, 7}, "R"}, {{4, 7}, "R"}, {{4, 7}, "P(max)"}}, shape_attr({4, 7})), "R; R; R | R");
  EXPECT_EQ(grad("expand", {2}, {{{1, 7}, "R"}, {{1, 7}, "R"}, {{1, 7}, "P(max)"}}, shape_attr({1, 7})),
            "R; R; P(max) | P(max)");
  EXPECT_EQ(grad("expand", {2}, {{{1, 7}, "R"}, {{4, 7}, "R"}, {{4, 7}, "P(avg)"}}, shape_attr({4, 7})),
            "R; R; P(avg) | P(avg)");
}

TEST(ShapeRules, ConcatMergesInputsAndReplicatesTheAxis) {
  Attrs axis1{{"axis", int64_t{1}}};
  // x1 shards dim 0 on mesh dim 0 and wins; x2's dim 0 sharding (mesh dim 1) loses.
  EXPECT_EQ(fwd("concat", {2, 2}, {{{4, 6}, "S(0),R"}, {{4, 3}, "R,S(0)"}}, axis1), "S(0),R; S(0),R | S(0),R");
  // The concat axis is Replicate.
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "S(1)"}, {{4, 3}, "S(0)"}}, axis1), "S(0); S(0) | S(0)");
  // The first input that shards a dim wins, whichever input it is.
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "R"}, {{4, 3}, "S(0)"}, {{4, 1}, "R"}}, axis1), "S(0); S(0); S(0) | S(0)");
  // Partial: sum/avg only when every input has it; max/min with Replicate operands.
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(sum)"}, {{4, 3}, "P(sum)"}}, axis1), "P(sum); P(sum) | P(sum)");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(sum)"}, {{4, 3}, "R"}}, axis1), "R; R | R");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(avg)"}, {{4, 3}, "P(sum)"}}, axis1), "R; R | R");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "R"}, {{4, 3}, "P(min)"}}, axis1), "R; P(min) | P(min)");
  EXPECT_EQ(fwd("concat", {2}, {{{4, 6}, "P(max)"}, {{4, 3}, "P(min)"}}, axis1), "P(max); R | P(max)");
  EXPECT_THROW(fwd("concat", {2}, {{{4, 6}, "R"}, {{5, 3}, "R"}}, axis1), Error);
  EXPECT_EQ(rev("concat", {2, 2}, {{4, 6}, {4, 3}}, {{{4, 9}, "S(1),P(avg)"}}, axis1), "R,P(avg); R,P(avg) | R,P(avg)");
  EXPECT_EQ(grad("concat", {2, 2}, {{{4, 6}, "R,R"}, {{4, 3}, "R,R"}, {{4, 9}, "R,R"}, {{4, 9}, "S(1),P(max)"}}, axis1),
            "R,R; R,R; R,R; R,P(max) | R,P(max); R,P(max)");
}

TEST(ShapeRules, StackAndSplit) {
  Attrs axis0{{"axis", int64_t{0}}};
  EXPECT_EQ(fwd("stack", {2}, {{{4}, "R"}, {{4}, "S(0)"}}, axis0), "S(0); S(0) | S(1)");
  EXPECT_EQ(fwd("stack", {2}, {{{4}, "P(sum)"}, {{4}, "P(sum)"}}, Attrs{{"axis", int64_t{-1}}}),
            "P(sum); P(sum) | P(sum)");
  EXPECT_EQ(rev("stack", {2}, {{4}, {4}}, {{{2, 4}, "S(0)"}}, axis0), "R; R | R");
  EXPECT_EQ(rev("stack", {2}, {{4}, {4}}, {{{2, 4}, "S(1)"}}, axis0), "S(0); S(0) | S(1)");
  EXPECT_EQ(grad("stack", {2}, {{{4}, "R"}, {{4}, "R"}, {{2, 4}, "R"}, {{2, 4}, "S(1)"}}, axis0),
            "R; R; R; S(1) | S(0); S(0)");
  EXPECT_EQ(grad("stack", {2}, {{{4}, "R"}, {{4}, "R"}, {{2, 4}, "R"}, {{2, 4}, "S(0)"}}, axis0), "R; R; R; R | R; R");

  Attrs halves{{"axis", int64_t{0}}, {"num", int64_t{2}}};
  EXPECT_EQ(fwd("split", {2}, {{{6, 4}, "S(0)"}}, halves), "R | R; R");
  EXPECT_EQ(fwd("split", {2, 2}, {{{6, 4}, "S(1),P(min)"}}, halves), "S(1),P(min) | S(1),P(min); S(1),P(min)");
  EXPECT_EQ(rev("split", {2}, {{6, 4}}, {{{3, 4}, "S(1)"}, {{3, 4}, "R"}}, halves), "S(1) | S(1); S(1)");
  // Grad: the piece gradients merge like concat inputs (first wins), dx alike.
  EXPECT_EQ(
      grad("split", {2, 2},
           {{{6, 4}, "R,R"}, {{3, 4}, "R,R"}, {{3, 4}, "R,R"}, {{3, 4}, "R,S(1)"}, {{3, 4}, "S(1),S(0)"}}, halves),
      "R,R; R,R; R,R; R,S(1); R,S(1) | R,S(1)");
  EXPECT_THROW(grad("split", {2}, {{{6, 4}, "R"}, {{3, 4}, "R"}, {{3, 4}, "R"}}, halves), Error);
}

Attrs cut(std::vector<int64_t> axes, std::vector<int64_t> starts, std::vector<int64_t> ends) {
  return Attrs{{"axes", std::move(axes)}, {"starts", std::move(starts)}, {"ends", std::move(ends)}};
}

TEST(ShapeRules, SliceReplicatesCutDims) {
  EXPECT_EQ(fwd("slice", {2, 2}, {{{5, 7}, "S(0),S(1)"}}, cut({1}, {1}, {3})), "S(0),R | S(0),R");
  // A listed axis with the whole range is not cut: its sharding stays.
  EXPECT_EQ(fwd("slice", {2, 2}, {{{5, 7}, "S(0),S(1)"}}, cut({1}, {0}, {7})), "S(0),S(1) | S(0),S(1)");
  EXPECT_EQ(fwd("slice", {2}, {{{5, 7}, "P(max)"}}, cut({0}, {1}, {3})), "P(max) | P(max)");
  EXPECT_EQ(rev("slice", {2}, {{5, 7}}, {{{2, 7}, "S(0)"}}, cut({0}, {1}, {3})), "R | R");
  EXPECT_EQ(grad("slice", {2, 2}, {{{5, 7}, "R,R"}, {{5, 2}, "R,R"}, {{5, 2}, "S(1),S(0)"}}, cut({1}, {1}, {3})),
            "R,R; R,R; R,S(0) | R,S(0)");
}

TEST(ShapeRules, TileReplicatesRepeatedDims) {
  Attrs reps{{"repeat_times", std::vector<int64_t>{2, 1, 3}}};  // [5,1] -> [2,5,3]
  EXPECT_EQ(fwd("tile", {2}, {{{5, 1}, "S(0)"}}, reps), "S(0) | S(1)");
  EXPECT_EQ(fwd("tile", {2}, {{{5, 1}, "S(1)"}}, reps), "R | R");
  EXPECT_EQ(fwd("tile", {2}, {{{2, 3}, "S(1)"}}, Attrs{{"repeat_times", std::vector<int64_t>{1, 2}}}), "R | R");
  EXPECT_EQ(rev("tile", {2, 2}, {{5, 1}}, {{{2, 5, 3}, "S(0),S(1)"}}, reps), "R,S(0) | R,S(1)");
  // Grad: a sharded new leading dim and a repeated extent-1 dim give dx P(sum); P(max) cannot pass a sum.
  EXPECT_EQ(grad("tile", {2, 2}, {{{5, 1}, "R,R"}, {{2, 5, 3}, "R,R"}, {{2, 5, 3}, "S(0),S(2)"}}, reps),
            "R,R; R,R; S(0),S(2) | P(sum),P(sum)");
  EXPECT_EQ(grad("tile", {2}, {{{2, 3}, "R"}, {{2, 6}, "R"}, {{2, 6}, "S(1)"}},
                 Attrs{{"repeat_times", std::vector<int64_t>{1, 2}}}),
            "R; R; R | R");
  EXPECT_EQ(grad("tile", {2}, {{{2, 3}, "R"}, {{2, 6}, "R"}, {{2, 6}, "P(max)"}},
                 Attrs{{"repeat_times", std::vector<int64_t>{1, 2}}}),
            "R; R; R | R");
  EXPECT_EQ(grad("tile", {2}, {{{2, 3}, "R"}, {{2, 3}, "R"}, {{2, 3}, "P(max)"}},
                 Attrs{{"repeat_times", std::vector<int64_t>{1, 1}}}),
            "R; R; P(max) | P(max)");
}

}  // namespace
}  // namespace rule_tests

}  // namespace shardwise::ops
