// Indexing kernels (index_select, gather, scatter_add, embedding, index_put) against hand values
// (PyTorch's documented examples where there is one), naive references that address elements by
// div/mod multi-indices, and the error messages for bad indices.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/index_ops.h"

namespace shardwise {
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
}  // namespace shardwise
