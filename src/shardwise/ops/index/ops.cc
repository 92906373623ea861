// The indexing ops: index_select, gather, scatter_add, embedding, index_put (kernels in
// kernels.h, rules in rules.cc and rules_embedding.cc). Indices are int64 (int32
// accepted); a negative or out-of-range index is an Error naming the op, the value and the range.
//
// embedding runs in context: its kernel reads the global vocab size and the vocab offset of the
// local weight block (vocab-parallel); on one device the offset is 0 and the vocab its own rows.
#include "shardwise/core/error.h"
#include "shardwise/ops/families.h"
#include "shardwise/ops/index/rules.h"
#include "shardwise/ops/index/kernels.h"

namespace shardwise::ops {

namespace {

using Kind = ValueGen::Kind;
constexpr DType f64 = DType::F64, f32 = DType::F32, i64 = DType::I64;

int64_t axis_of(const Attrs& attrs) { return attrs.get_int("axis", 0); }

void check_same(std::string_view op, DType a, std::string_view a_name, DType b, std::string_view b_name) {
  SW_CHECK(a == b, "{}: {} holds {} but {} holds {} (allowed: the same dtype)", op, a_name, dtype_name(a), b_name,
           dtype_name(b));
}

ValueGen index_gen(int64_t lo, int64_t hi) {
  return {Kind::Index, static_cast<double>(lo), static_cast<double>(hi)};
}

Attrs axis_attr(int64_t axis) {
  Attrs a;
  a.set("axis", axis);
  return a;
}

// ---- index_select ---------------------------------------------------------------------------------

std::vector<VerifyCase> index_select_cases() {
  auto c = [](Shape x, DType dt, int64_t k, int64_t axis, int64_t hi, ValueGen xgen = {}) {
    return VerifyCase{{x, Shape{k}}, {dt, i64}, axis_attr(axis), {xgen, index_gen(0, hi)}};
  };
  return {
      c({12}, f64, 12, 0, 11),                            // even on every test mesh
      c({5, 7}, f64, 6, 0, 2),                            // uneven; 6 indices in [0, 2]: duplicates
      c({4, 7}, f64, 5, -1, 6),                           // select along the last axis
      c({1, 6}, f64, 3, 0, 0),                            // a dim of 1: empty shards
      c({3, 5}, f32, 7, 1, 4),                            // f32
      c({4, 3}, i64, 6, 0, 3, {Kind::Uniform, -9, 9}),  // integers: exact
  };
}

void add_index_select(OpRegistry& registry) {
  OpDef op;
  op.name = "index_select";
  op.family = "index";
  op.rule = rules_of<index_rules>().index_select;
  op.summary =
      "index_select(x, index [k]; axis=0): x with `axis` replaced by the k rows x[.., index[i], ..]. Gradient: "
      "zeros of x's shape with dout's rows added at index (duplicates accumulate)";
  op.num_inputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_index_dtype("index_select", "index", in[1].dtype);
    return std::vector<TensorMeta>{{index_select_shape(in[0].shape, in[1].shape, axis_of(attrs)), in[0].dtype}};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{index_select(in[0], in[1], axis_of(attrs))};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    return std::vector<Tensor>{index_select_backward(in[0].shape(), in[1], dout[0], axis_of(attrs)), Tensor()};
  };
  op.cases = index_select_cases();
  registry.add(std::move(op));
}

// ---- gather ---------------------------------------------------------------------------------------

std::vector<VerifyCase> gather_cases() {
  auto c = [](Shape x, Shape index, DType dt, int64_t axis, int64_t hi) {
    return VerifyCase{{x, index}, {dt, i64}, axis_attr(axis), {ValueGen{}, index_gen(0, hi)}};
  };
  return {
      c({12}, {12}, f64, 0, 11),      // even on every test mesh
      c({5, 4}, {6, 4}, f64, 0, 4),   // index longer than x on axis; dim 1 shared (equal extents)
      c({4, 7}, {3, 5}, f64, 1, 6),   // index smaller than x on the other dim: that dim is not shared
      c({1, 6}, {1, 4}, f64, 1, 5),   // a dim of 1: empty shards
      c({3, 5}, {3, 5}, f32, 0, 2),   // f32, duplicates along axis 0
  };
}

void add_gather(OpRegistry& registry) {
  OpDef op;
  op.name = "gather";
  op.family = "index";
  op.rule = rules_of<index_rules>().gather;
  op.summary =
      "gather(x, index; axis=0): torch.gather, out[p] = x[p with p[axis] = index[p]] (index has x's rank, "
      "index.shape[d] <= x.shape[d] off the axis). Gradient: dout scatter-added into zeros of x's shape";
  op.num_inputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_index_dtype("gather", "index", in[1].dtype);
    check_gather_shapes(in[0].shape, in[1].shape, axis_of(attrs));
    return std::vector<TensorMeta>{{in[1].shape, in[0].dtype}};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{gather(in[0], in[1], axis_of(attrs))};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    return std::vector<Tensor>{gather_backward(in[0].shape(), in[1], dout[0], axis_of(attrs)), Tensor()};
  };
  op.cases = gather_cases();
  registry.add(std::move(op));
}

// ---- scatter_add ----------------------------------------------------------------------------------

std::vector<VerifyCase> scatter_add_cases() {
  auto c = [](Shape x, Shape index, Shape src, DType dt, int64_t axis, int64_t hi, ValueGen gen = {}) {
    return VerifyCase{{x, index, src}, {dt, i64, dt}, axis_attr(axis), {gen, index_gen(0, hi), gen}};
  };
  return {
      c({12}, {12}, {12}, f64, 0, 5),              // even on every test mesh; duplicates
      c({5, 4}, {6, 4}, {6, 4}, f64, 0, 4),        // uneven; dim 1 shared by x, index, src
      c({4, 7}, {4, 3}, {4, 5}, f64, 1, 6),        // src larger than index on the axis
      c({4, 6}, {3, 2}, {3, 6}, f64, 0, 3),        // extents differ off the axis: nothing shared
      c({1, 6}, {1, 4}, {1, 4}, f64, 1, 5),        // a dim of 1: empty shards
      c({3, 5}, {4, 5}, {4, 5}, f32, 0, 2),        // f32, duplicates
      c({4, 3}, {5, 3}, {5, 3}, i64, 0, 3, {Kind::Uniform, -9, 9}),  // integers: exact
  };
}

void add_scatter_add(OpRegistry& registry) {
  OpDef op;
  op.name = "scatter_add";
  op.family = "index";
  op.rule = rules_of<index_rules>().scatter_add;
  op.summary =
      "scatter_add(x, index, src; axis=0): torch.scatter_add, out = x; out[p with p[axis] = index[p]] += src[p] in "
      "row-major order of index. Gradients: dx = dout, dsrc = gather(dout, index) (zeros where index does not "
      "reach)";
  op.num_inputs = 3;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    check_index_dtype("scatter_add", "index", in[1].dtype);
    check_same("scatter_add", in[0].dtype, "x", in[2].dtype, "src");
    SW_CHECK(in[0].dtype != DType::Bool, "scatter_add: cannot add bool values (allowed: floating and integer dtypes)");
    check_scatter_add_shapes(in[0].shape, in[1].shape, in[2].shape, axis_of(attrs));
    return std::vector<TensorMeta>{{in[0].shape, in[0].dtype}};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    return std::vector<Tensor>{scatter_add(in[0], in[1], in[2], axis_of(attrs))};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    return std::vector<Tensor>{dout[0].clone(), Tensor(),
                               scatter_add_src_backward(in[2].shape(), in[1], dout[0], axis_of(attrs))};
  };
  op.cases = scatter_add_cases();
  registry.add(std::move(op));
}

// ---- embedding ------------------------------------------------------------------------------------

// The vocab block of the local weight (tensors[1] of the context, forward and backward alike).
struct VocabBlock {
  int64_t offset = 0, size = 0;
};

VocabBlock vocab_block(const KernelContext& ctx, const Tensor& weight) {
  if (ctx.tensors.size() < 2 || ctx.tensors[1].global_shape.ndim() != 2) return {0, weight.shape()[0]};
  return {ctx.tensors[1].offset[0], ctx.tensors[1].global_shape[0]};
}

std::vector<VerifyCase> embedding_cases() {
  auto c = [](Shape ids, int64_t vocab, int64_t hidden, DType dt, int64_t hi) {
    return VerifyCase{{ids, Shape{vocab, hidden}}, {i64, dt}, {}, {index_gen(0, hi), ValueGen{}}};
  };
  return {
      c({12}, 12, 12, f64, 11),   // even on every test mesh (V = 12)
      c({6}, 5, 3, f64, 2),       // V = 5: uneven and empty vocab shards; 6 ids in [0, 2]: duplicates
      c({2, 3}, 7, 4, f64, 6),    // 2-D ids, V = 7
      c({1, 4}, 5, 1, f64, 4),    // a dim of 1 in ids and H = 1: empty shards
      c({4, 2}, 5, 6, f32, 4),    // f32
      c({6}, 7, 2, f64, 1),       // ids in [0, 1] only: most vocab shards hold none of them
  };
}

void add_embedding(OpRegistry& registry) {
  OpDef op;
  op.name = "embedding";
  op.family = "index";
  op.rule = rules_of<index_rules>().embedding;
  op.summary =
      "embedding(ids [...], weight [V, H]) -> [..., H]; vocab-parallel: a weight block of rows [v0, v0 + V_local) "
      "gives zeros for ids outside it (ids outside [0, V) are an Error). Gradient: dweight = zeros with dout's rows "
      "added at the ids (duplicates sum); ids take none";
  op.num_inputs = 2;
  op.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    check_index_dtype("embedding", "ids", in[0].dtype);
    return std::vector<TensorMeta>{{embedding_shape(in[0].shape, in[1].shape), in[1].dtype}};
  };
  op.forward_in_context = [](std::span<const Tensor> in, const Attrs&, const KernelContext& ctx) {
    VocabBlock b = vocab_block(ctx, in[1]);
    return std::vector<Tensor>{embedding(in[0], in[1], b.offset, b.size)};
  };
  op.backward_in_context = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                              const Attrs&, const KernelContext& ctx) {
    VocabBlock b = vocab_block(ctx, in[1]);
    return std::vector<Tensor>{Tensor(), embedding_backward(in[0], dout[0], in[1].shape(), b.offset, b.size)};
  };
  op.backward_reads = std::vector<int>{0};  // the ids; the weight's shape only
  op.cases = embedding_cases();
  registry.add(std::move(op));
}

// ---- index_put ------------------------------------------------------------------------------------

bool accumulate_of(const Attrs& attrs) { return attrs.get_bool("accumulate", false); }

std::vector<VerifyCase> index_put_cases() {
  auto c = [](Shape x, std::vector<std::pair<Shape, int64_t>> indices, Shape value, DType dt, bool accumulate) {
    VerifyCase vc;
    vc.shapes.push_back(x);
    vc.dtypes.push_back(dt);
    vc.values.emplace_back();
    for (auto& [shape, hi] : indices) {
      vc.shapes.push_back(shape);
      vc.dtypes.push_back(i64);
      vc.values.push_back(index_gen(0, hi));
    }
    vc.shapes.push_back(value);
    vc.dtypes.push_back(dt);
    vc.values.emplace_back();
    vc.attrs.set("accumulate", accumulate);
    return vc;
  };
  return {
      c({12}, {{{12}, 5}}, {12}, f64, true),             // even; duplicates sum
      c({12}, {{{12}, 5}}, {12}, f64, false),            // even; duplicates: the last write wins
      c({5, 4}, {{{6}, 2}}, {6, 4}, f64, true),          // uneven; 6 indices in [0, 2]
      c({5, 4}, {{{6}, 4}}, {4}, f64, false),            // value broadcast over the indices
      c({4, 7}, {{{3}, 3}}, {3, 1}, f64, true),          // value broadcast along x's sharded dim
      c({1, 6}, {{{2}, 0}}, {2, 6}, f64, true),          // a dim of 1: empty shards
      c({5, 3}, {{{4}, 4}}, {1}, f32, true),             // f32, scalar-like value
      c({3, 4}, {{{5}, 2}, {{5}, 3}}, {5}, f64, true),   // k = 2
      c({3, 4}, {{{2, 1}, 2}, {{3}, 3}}, {2, 3}, f64, false),  // k = 2, indices broadcast to [2, 3]
  };
}

void add_index_put(OpRegistry& registry) {
  OpDef op;
  op.name = "index_put";
  op.family = "index";
  op.rule = rules_of<index_rules>().index_put;
  op.summary =
      "index_put(x, indices_1..k, value; accumulate=false): the k index tensors broadcast to B and index x's first "
      "k dims; value broadcasts to B ++ x.shape[k:]. accumulate: out = x + value at each position (duplicates sum "
      "in order); else assignment, duplicates: the LAST write (row-major over B) wins. Gradients: dx = dout with "
      "zeros at written positions (accumulate: dout), dvalue = dout gathered at the positions, summed over value's "
      "broadcast dims; indices take none";
  op.num_inputs = -1;
  op.infer = [](std::span<const TensorMeta> in, const Attrs& attrs) {
    SW_CHECK(in.size() >= 3, "index_put takes x, at least one index tensor and value; got {} inputs", in.size());
    std::array<Shape, kMaxDims> shapes;
    const size_t k = in.size() - 2;
    SW_CHECK(k <= static_cast<size_t>(in[0].shape.ndim()), "index_put: {} index tensors for x {} of rank {}", k,
             in[0].shape.to_string(), in[0].shape.ndim());
    for (size_t j = 0; j < k; ++j) {
      check_index_dtype("index_put", "indices", in[j + 1].dtype);
      shapes[j] = in[j + 1].shape;
    }
    check_same("index_put", in[0].dtype, "x", in.back().dtype, "value");
    SW_CHECK(!accumulate_of(attrs) || in[0].dtype != DType::Bool,
             "index_put: accumulate=true cannot add bool values (allowed: floating and integer dtypes)");
    index_put_index_shape(in[0].shape, std::span<const Shape>(shapes.data(), k), in.back().shape);
    return std::vector<TensorMeta>{{in[0].shape, in[0].dtype}};
  };
  op.forward = [](std::span<const Tensor> in, const Attrs& attrs) {
    SW_CHECK(in.size() >= 3, "index_put takes x, at least one index tensor and value; got {} inputs", in.size());
    return std::vector<Tensor>{index_put(in[0], in.subspan(1, in.size() - 2), in.back(), accumulate_of(attrs))};
  };
  op.backward = [](std::span<const Tensor> in, std::span<const Tensor>, std::span<const Tensor> dout,
                   const Attrs& attrs) {
    SW_CHECK(in.size() >= 3, "index_put takes x, at least one index tensor and value; got {} inputs", in.size());
    IndexPutGrads g = index_put_backward(dout[0], in.subspan(1, in.size() - 2), in.back().shape(), accumulate_of(attrs));
    std::vector<Tensor> grads(in.size());
    grads.front() = g.x;
    grads.back() = g.value;
    return grads;
  };
  op.cases = index_put_cases();
  registry.add(std::move(op));
}

}  // namespace

void register_index_ops(OpRegistry& registry) {
  add_index_select(registry);
  add_gather(registry);
  add_scatter_add(registry);
  add_embedding(registry);
  add_index_put(registry);
}

}  // namespace shardwise::ops
