// The index family: its kernels, SPMD rules and registry entries tested side by side.
//
// Indexing kernels (index_select, gather, scatter_add, embedding, index_put) against hand values
// (PyTorch's documented examples where there is one), naive references that address elements by
// div/mod multi-indices, and the error messages for bad indices.
//
// Rules "index_select", "gather", "scatter_add", "embedding", "index_put": explicit expected
// distributions for forward, reverse and grad on a 2x2 mesh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/ops/index/kernels.h"
#include "shardwise/ops/op.h"
#include "shardwise/spmd/rule.h"

namespace shardwise::ops {

// ---- kernels (from tensor/test_index_ops.cc)
namespace kernel_tests {
namespace {

Tensor f64(const Shape& s, std::vector<double> v) { return Tensor::from<double>(s, v); }
Tensor i64(const Shape& s, std::vector<int64_t> v) { return Tensor::from<int64_t>(s, v); }
Tensor iota(const Shape& s) {
  Tensor t(DType::F64, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_at(i, static_cast<double>(i));
  return t;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.at(i));
  return out;
}

// Multi-index of flat element i of `s` (div/mod: independent of the kernels' odometer walk).
std::vector<int64_t> coords(const Shape& s, int64_t i) {
  std::vector<int64_t> c(s.size());
  for (int d = s.ndim() - 1; d >= 0; --d) {
    c[static_cast<size_t>(d)] = i % s[d];
    i /= s[d];
  }
  return c;
}
int64_t flat(const Shape& s, const std::vector<int64_t>& c) {
  int64_t i = 0;
  for (int d = 0; d < s.ndim(); ++d) i = i * s[d] + c[static_cast<size_t>(d)];
  return i;
}

// Runs `fn` and expects an Error whose message holds every string in `parts`.
template <class Fn>
void expect_error(Fn&& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// Deterministic pseudo-random integers in [0, n).
std::vector<int64_t> ints(size_t count, int64_t n, uint64_t seed) {
  std::vector<int64_t> v;
  for (size_t i = 0; i < count; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(static_cast<int64_t>((seed >> 33) % static_cast<uint64_t>(n)));
  }
  return v;
}

// ---- index_select --------------------------------------------------------------------------------

TEST(IndexSelect, HandValues) {
  Tensor x = iota({3, 4});  // [[0,1,2,3],[4,5,6,7],[8,9,10,11]]
  Tensor rows = index_select(x, i64({3}, {2, 0, 2}), 0);
  EXPECT_EQ(rows.shape(), (Shape{3, 4}));
  EXPECT_EQ(values(rows), (std::vector<double>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11}));
  Tensor cols = index_select(x, i64({2}, {3, 1}), -1);
  EXPECT_EQ(cols.shape(), (Shape{3, 2}));
  EXPECT_EQ(values(cols), (std::vector<double>{3, 1, 7, 5, 11, 9}));
  // int32 indices, integer data.
  Tensor xi = Tensor::from<int32_t>({4}, std::vector<int32_t>{10, 20, 30, 40});
  Tensor sel = index_select(xi, Tensor::from<int32_t>({2}, std::vector<int32_t>{3, 0}), 0);
  EXPECT_EQ(values(sel), (std::vector<double>{40, 10}));
  // No index: an empty output; an empty x with no index is fine too.
  EXPECT_EQ(index_select(x, i64({0}, {}), 1).shape(), (Shape{3, 0}));
  EXPECT_EQ(index_select(Tensor(DType::F64, {0, 4}), i64({2}, {1, 0}), 1).shape(), (Shape{0, 2}));
}

TEST(IndexSelect, BackwardAccumulatesDuplicates) {
  Tensor dout = f64({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor dx = index_select_backward({3, 2}, i64({3}, {2, 0, 2}), dout, 0);
  EXPECT_EQ(values(dx), (std::vector<double>{3, 4, 0, 0, 6, 8}));
  Tensor dcols = index_select_backward({2, 3}, i64({2}, {1, 1}), f64({2, 2}, {1, 2, 3, 4}), 1);
  EXPECT_EQ(values(dcols), (std::vector<double>{0, 3, 0, 0, 7, 0}));
}

TEST(IndexSelect, MatchesNaiveReference) {
  const Shape xs{3, 4, 5};
  Tensor x = iota(xs);
  std::vector<int64_t> idx = ints(7, 4, 11);
  Tensor out = index_select(x, i64({7}, idx), 1);
  ASSERT_EQ(out.shape(), (Shape{3, 7, 5}));
  for (int64_t i = 0; i < out.numel(); ++i) {
    auto c = coords(out.shape(), i);
    c[1] = idx[static_cast<size_t>(c[1])];
    EXPECT_EQ(out.at(i), x.at(flat(xs, c))) << i;
  }
}

TEST(IndexSelect, RejectsBadIndices) {
  Tensor x = iota({3, 4});
  expect_error([&] { index_select(x, i64({2}, {0, 3}), 0); }, {"index_select", "3", "0..2"});
  expect_error([&] { index_select(x, i64({1}, {-1}), 1); }, {"index_select", "-1", "0..3", "negative"});
  expect_error([&] { index_select(x, f64({1}, {0}), 0); }, {"index_select", "f64"});
  expect_error([&] { index_select(x, i64({1, 1}, {0}), 0); }, {"index_select", "1-D"});
  expect_error([&] { index_select(x, i64({1}, {0}), 2); }, {"index_select", "axis 2"});
}

// ---- gather ---------------------------------------------------------------------------------------

TEST(Gather, TorchExample) {
  // torch.gather(torch.tensor([[1, 2], [3, 4]]), 1, torch.tensor([[0, 0], [1, 0]])) = [[1, 1], [4, 3]]
  Tensor x = f64({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(values(gather(x, i64({2, 2}, {0, 0, 1, 0}), 1)), (std::vector<double>{1, 1, 4, 3}));
  EXPECT_EQ(values(gather(x, i64({2, 2}, {1, 0, 0, 0}), 0)), (std::vector<double>{3, 2, 1, 2}));
  // index smaller than x off the axis, longer on it.
  Tensor y = iota({3, 4});
  Tensor out = gather(y, i64({4, 2}, {2, 0, 1, 1, 0, 2, 2, 2}), 0);
  EXPECT_EQ(out.shape(), (Shape{4, 2}));
  EXPECT_EQ(values(out), (std::vector<double>{8, 1, 4, 5, 0, 9, 8, 9}));
}

TEST(Gather, MatchesNaiveReferenceAndBackward) {
  const Shape xs{3, 4, 5}, is{2, 6, 3};
  Tensor x = iota(xs);
  std::vector<int64_t> idx = ints(static_cast<size_t>(is.numel()), 4, 5);
  Tensor index = i64(is, idx);
  Tensor out = gather(x, index, 1);
  Tensor dout(DType::F64, is);
  for (int64_t i = 0; i < dout.numel(); ++i) dout.set_at(i, 1.0 + 0.5 * static_cast<double>(i));
  std::vector<double> dx_ref(static_cast<size_t>(xs.numel()), 0.0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    auto c = coords(is, i);
    c[1] = idx[static_cast<size_t>(i)];
    EXPECT_EQ(out.at(i), x.at(flat(xs, c))) << i;
    dx_ref[static_cast<size_t>(flat(xs, c))] += dout.at(i);
  }
  EXPECT_EQ(values(gather_backward(xs, index, dout, 1)), dx_ref);
}

TEST(Gather, RejectsBadShapesAndIndices) {
  Tensor x = iota({3, 4});
  expect_error([&] { gather(x, i64({1, 1}, {4}), 1); }, {"gather", "4", "0..3"});
  expect_error([&] { gather(x, i64({4, 1}, {0, 0, 0, 0}), 1); }, {"gather", "dim 0"});
  expect_error([&] { gather(x, i64({2}, {0, 0}), 0); }, {"gather", "rank"});
}

// ---- scatter_add ----------------------------------------------------------------------------------

TEST(ScatterAdd, TorchExamples) {
  Tensor src = Tensor::full(DType::F64, {2, 5}, 1.0);
  Tensor zeros(DType::F64, {3, 5});
  Tensor one = scatter_add(zeros, i64({1, 5}, {0, 1, 2, 0, 0}), src, 0);
  EXPECT_EQ(values(one), (std::vector<double>{1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0}));
  Tensor two = scatter_add(zeros, i64({2, 5}, {0, 1, 2, 0, 0, 0, 1, 2, 2, 2}), src, 0);
  EXPECT_EQ(values(two), (std::vector<double>{2, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 0, 2, 1, 1}));
  EXPECT_EQ(values(zeros), std::vector<double>(15, 0.0));  // x is not modified
}

TEST(ScatterAdd, MatchesNaiveReferenceAndBackward) {
  const Shape xs{3, 4}, is{2, 6}, ss{3, 7};
  Tensor x = iota(xs);
  Tensor src(DType::F64, ss);
  for (int64_t i = 0; i < src.numel(); ++i) src.set_at(i, 0.25 * static_cast<double>(i) - 2.0);
  std::vector<int64_t> idx = ints(static_cast<size_t>(is.numel()), 4, 9);
  Tensor index = i64(is, idx);
  std::vector<double> ref = values(x);
  for (int64_t i = 0; i < is.numel(); ++i) {
    auto c = coords(is, i);
    double s = src.at(flat(ss, c));
    c[1] = idx[static_cast<size_t>(i)];
    ref[static_cast<size_t>(flat(xs, c))] += s;
  }
  EXPECT_EQ(values(scatter_add(x, index, src, 1)), ref);
  // dsrc = dout gathered at index in the index-shaped corner, zeros elsewhere.
  Tensor dout = iota(xs);
  Tensor dsrc = scatter_add_src_backward(ss, index, dout, 1);
  ASSERT_EQ(dsrc.shape(), ss);
  for (int64_t i = 0; i < ss.numel(); ++i) {
    auto c = coords(ss, i);
    double want = 0;
    if (c[0] < is[0] && c[1] < is[1]) {
      int64_t v = idx[static_cast<size_t>(flat(is, c))];
      want = dout.at(flat(xs, {c[0], v}));
    }
    EXPECT_EQ(dsrc.at(i), want) << i;
  }
}

TEST(ScatterAdd, IntegersAndErrors) {
  Tensor x = Tensor::from<int64_t>({3}, std::vector<int64_t>{1, 2, 3});
  Tensor src = Tensor::from<int64_t>({4}, std::vector<int64_t>{10, 20, 30, 40});
  EXPECT_EQ(values(scatter_add(x, i64({4}, {2, 2, 0, 2}), src, 0)), (std::vector<double>{31, 2, 73}));
  expect_error([&] { scatter_add(x, i64({1}, {3}), src, 0); }, {"scatter_add", "3", "0..2"});
  expect_error([&] { scatter_add(x, i64({5}, {0, 0, 0, 0, 0}), src, 0); }, {"scatter_add", "src"});
  expect_error([&] { scatter_add(x, i64({1}, {0}), f64({1}, {1.0}), 0); }, {"scatter_add", "i64", "f64"});
  Tensor b(DType::Bool, {2});
  expect_error([&] { scatter_add(b, i64({1}, {0}), b, 0); }, {"scatter_add", "bool"});
}

// ---- embedding ------------------------------------------------------------------------------------

TEST(Embedding, HandValues) {
  Tensor w = f64({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  Tensor out = embedding(i64({2, 2}, {3, 0, 3, 1}), w, 0, 4);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values(out), (std::vector<double>{30, 31, 0, 1, 30, 31, 10, 11}));
  EXPECT_EQ(embedding(Tensor::scalar<int64_t>(2), w, 0, 4).shape(), (Shape{2}));
}

TEST(Embedding, VocabBlocksSumToTheFullEmbedding) {
  // V = 5 split as rows [0, 2), [2, 4), [4, 5) and an empty block [5, 5).
  Tensor w = iota({5, 3});
  Tensor ids = i64({6}, {4, 0, 2, 2, 1, 3});
  Tensor full = embedding(ids, w, 0, 5);
  std::vector<double> sum(static_cast<size_t>(full.numel()), 0.0);
  const int64_t starts[] = {0, 2, 4, 5}, ends[] = {2, 4, 5, 5};
  for (int b = 0; b < 4; ++b) {
    Tensor block = w.slice(std::vector<int64_t>{starts[b], 0}, Shape{ends[b] - starts[b], 3});
    Tensor part = embedding(ids, block, starts[b], 5);
    for (int64_t i = 0; i < part.numel(); ++i) {
      int64_t id = ids.data<int64_t>()[i / 3];
      bool mine = id >= starts[b] && id < ends[b];
      EXPECT_EQ(part.at(i), mine ? w.at(id * 3 + i % 3) : 0.0) << "block " << b << " element " << i;
      sum[static_cast<size_t>(i)] += part.at(i);
    }
  }
  EXPECT_EQ(sum, values(full));
}

TEST(Embedding, BackwardSumsDuplicatesPerBlock) {
  Tensor ids = i64({4}, {1, 3, 1, 1});
  Tensor dout = f64({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(values(embedding_backward(ids, dout, {4, 2}, 0, 4)), (std::vector<double>{0, 0, 13, 16, 0, 0, 3, 4}));
  // The block of rows [2, 4): only id 3 falls in it (local row 1).
  EXPECT_EQ(values(embedding_backward(ids, dout, {2, 2}, 2, 4)), (std::vector<double>{0, 0, 3, 4}));
}

TEST(Embedding, RejectsIdsOutsideTheVocab) {
  Tensor w = iota({4, 2});
  expect_error([&] { embedding(i64({2}, {1, 4}), w, 0, 4); }, {"embedding", "4", "0..3"});
  expect_error([&] { embedding(i64({1}, {-2}), w, 0, 4); }, {"embedding", "-2"});
  // An id of the vocab that is outside the local block is not an error: zeros.
  Tensor block = w.slice(std::vector<int64_t>{0, 0}, Shape{2, 2});
  EXPECT_EQ(values(embedding(i64({1}, {5}), block, 0, 6)), (std::vector<double>{0, 0}));
  expect_error([&] { embedding(i64({1}, {6}), block, 0, 6); }, {"embedding", "6", "0..5"});
  expect_error([&] { embedding(i64({1}, {0}), iota({4}), 0, 4); }, {"embedding", "2-D"});
}

// ---- index_put ------------------------------------------------------------------------------------

TEST(IndexPut, AssignLastWriteWinsAndAccumulateSums) {
  Tensor x = f64({3, 2}, {1, 1, 1, 1, 1, 1});
  Tensor idx = i64({3}, {2, 0, 2});
  Tensor value = f64({3, 2}, {1, 2, 3, 4, 5, 6});
  std::vector<Tensor> indices = {idx};
  EXPECT_EQ(values(index_put(x, indices, value, false)), (std::vector<double>{3, 4, 1, 1, 5, 6}));
  EXPECT_EQ(values(index_put(x, indices, value, true)), (std::vector<double>{4, 5, 1, 1, 7, 9}));
  // value broadcast over the indices: [10, 20] written at rows 2, 0, 2.
  EXPECT_EQ(values(index_put(x, indices, f64({2}, {10, 20}), true)), (std::vector<double>{11, 21, 1, 1, 21, 41}));
  EXPECT_EQ(values(x), std::vector<double>(6, 1.0));  // x is not modified
}

TEST(IndexPut, TwoIndexTensorsBroadcast) {
  Tensor x(DType::F64, {3, 4});
  // indices [2, 1] and [3] broadcast to B = [2, 3]: rows {0, 2} x columns {1, 3, 1}.
  std::vector<Tensor> indices = {i64({2, 1}, {0, 2}), i64({3}, {1, 3, 1})};
  Tensor value = f64({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values(index_put(x, indices, value, false)), (std::vector<double>{0, 3, 0, 2, 0, 0, 0, 0, 0, 6, 0, 5}));
  EXPECT_EQ(values(index_put(x, indices, value, true)), (std::vector<double>{0, 4, 0, 2, 0, 0, 0, 0, 0, 10, 0, 5}));
  IndexPutGrads g = index_put_backward(iota({3, 4}), indices, {2, 3}, false);
  EXPECT_EQ(values(g.x), (std::vector<double>{0, 0, 2, 0, 4, 5, 6, 7, 8, 0, 10, 0}));
  EXPECT_EQ(values(g.value), (std::vector<double>{1, 3, 1, 9, 11, 9}));
  // A value broadcast over B sums the gathered gradient.
  IndexPutGrads s = index_put_backward(iota({3, 4}), indices, {1}, true);
  EXPECT_EQ(values(s.x), values(iota({3, 4})));
  EXPECT_EQ(values(s.value), (std::vector<double>{1 + 3 + 1 + 9 + 11 + 9}));
}

TEST(IndexPut, BackwardMatchesNaiveReference) {
  const Shape xs{4, 3};
  Tensor dout = iota(xs);
  std::vector<int64_t> idx = {3, 1, 3, 0, 3};
  std::vector<Tensor> indices = {i64({5}, idx)};
  // value [5, 1]: broadcast along x's trailing dim.
  IndexPutGrads g = index_put_backward(dout, indices, {5, 1}, false);
  std::vector<double> dx = values(dout), dv(5, 0.0);
  for (size_t b = 0; b < idx.size(); ++b) {
    for (int64_t c = 0; c < 3; ++c) {
      dv[b] += dout.at(idx[b] * 3 + c);
      dx[static_cast<size_t>(idx[b] * 3 + c)] = 0;
    }
  }
  EXPECT_EQ(values(g.x), dx);
  EXPECT_EQ(values(g.value), dv);
  EXPECT_EQ(g.value.shape(), (Shape{5, 1}));
}

TEST(IndexPut, Float16AccumulatesInOrder) {
  Tensor x = Tensor::full(DType::F16, {2}, 0.0);
  Tensor value = Tensor::from<f16>({3}, std::vector<f16>{f16(1.0f), f16(2.0f), f16(4.0f)});
  std::vector<Tensor> indices = {i64({3}, {1, 1, 0})};
  EXPECT_EQ(values(index_put(x, indices, value, true)), (std::vector<double>{4, 3}));
}

TEST(IndexPut, RejectsBadInputs) {
  Tensor x = iota({3, 2});
  std::vector<Tensor> bad = {i64({2}, {0, 3})};
  expect_error([&] { index_put(x, bad, f64({1}, {1}), false); }, {"index_put", "3", "0..2"});
  std::vector<Tensor> ok = {i64({2}, {0, 1})};
  expect_error([&] { index_put(x, ok, f64({3}, {1, 2, 3}), false); }, {"index_put", "value", "broadcast"});
  std::vector<Tensor> clash = {i64({2}, {0, 1}), i64({3}, {0, 1, 1})};
  expect_error([&] { index_put(x, clash, f64({1}, {1}), false); }, {"broadcast"});
  std::vector<Tensor> too_many = {ok[0], ok[0], ok[0]};
  expect_error([&] { index_put(x, too_many, f64({1}, {1}), false); }, {"index_put", "3 index tensors"});
  expect_error([&] { index_put(x, ok, Tensor::from<float>({1}, std::vector<float>{1}), false); },
               {"index_put", "f64", "f32"});
}

}  // namespace
}  // namespace kernel_tests

// ---- SPMD rules (from spmd/test_index_rules.cc)
namespace rule_tests {
using namespace spmd;
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
  SpmdResult r = op_registry().rule(rule).forward(mesh22(), in, attrs);
  expect_dists(r.inputs, inputs, "input", given(in));
  expect_dists(r.outputs, {out}, "output", given(in));
}

void expect_grad(const char* rule, std::vector<TensorSpec> in, const Attrs& attrs, std::vector<const char*> inputs,
                 std::vector<const char*> grads) {
  SpmdResult r = op_registry().rule(rule).grad(mesh22(), in, attrs);
  expect_dists(r.inputs, inputs, "grad input", given(in));
  expect_dists(r.outputs, grads, "gradient", given(in));
}

void expect_reverse(const char* rule, std::vector<TensorSpec> in, TensorSpec out, const Attrs& attrs,
                    std::vector<const char*> inputs, const char* want_out) {
  std::vector<TensorSpec> outs = {out};
  SpmdResult r = op_registry().rule(rule).reverse(mesh22(), in, outs, attrs);
  expect_dists(r.inputs, inputs, "input", "wanted " + out.dist.to_string());
  expect_dists(r.outputs, {want_out}, "output", "wanted " + out.dist.to_string());
}

TEST(IndexRules, Registered) {
  for (const char* name : {"index_select", "gather", "scatter_add", "embedding", "index_put"}) {
    const Rule& r = op_registry().rule(name);
    for (const OpDef* op : op_registry().all()) {
      if (op->rule.name == name) {
        EXPECT_EQ(op->family, "index") << name;
      }
    }
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
  EXPECT_THROW(op_registry().rule("index_select").forward(mesh22(), bad_axis, axis(2)), Error);
  std::vector<TensorSpec> bad_gather = {spec({5, 4}, "R,R"), ids({3, 5}, "R,R")};
  EXPECT_THROW(op_registry().rule("gather").forward(mesh22(), bad_gather, axis(0)), Error);
  std::vector<TensorSpec> bad_weight = {ids({4}, "R,R"), spec({12}, "R,R")};
  EXPECT_THROW(op_registry().rule("embedding").forward(mesh22(), bad_weight, {}), Error);
  std::vector<TensorSpec> bad_value = {spec({5, 4}, "R,R"), ids({6}, "R,R"), spec({3}, "R,R")};
  EXPECT_THROW(op_registry().rule("index_put").forward(mesh22(), bad_value, {}), Error);
  std::vector<TensorSpec> too_few = {spec({5, 4}, "R,R"), ids({6}, "R,R")};
  EXPECT_THROW(op_registry().rule("index_put").forward(mesh22(), too_few, {}), Error);
}

}  // namespace
}  // namespace rule_tests

}  // namespace shardwise::ops
