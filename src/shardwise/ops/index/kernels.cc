#include "shardwise/ops/index/kernels.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/broadcast.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

namespace {

using Strides = std::array<int64_t, kMaxDims>;

// Walks `shape` in row-major order and calls fn(offsets), offsets[t] = sum_d coord_d * strides[t][d],
// advancing the offsets like an odometer (no division per element).
template <size_t N, class Fn>
void walk(const Shape& shape, const std::array<Strides, N>& strides, Fn&& fn) {
  const int64_t total = shape.numel();
  std::array<int64_t, N> off{};
  std::array<int64_t, kMaxDims> idx{};
  const int nd = shape.ndim();
  for (int64_t i = 0; i < total; ++i) {
    fn(off);
    for (int d = nd - 1; d >= 0; --d) {
      auto du = static_cast<size_t>(d);
      for (size_t t = 0; t < N; ++t) off[t] += strides[t][du];
      if (++idx[du] < shape[d]) break;
      for (size_t t = 0; t < N; ++t) off[t] -= strides[t][du] * shape[d];
      idx[du] = 0;
    }
  }
}

// The index values as int64 (int32 indices are widened).
Tensor as_i64(const Tensor& index) { return index.dtype() == DType::I64 ? index : index.to(DType::I64); }

// Error unless 0 <= value < extent.
inline void check_range(std::string_view op, int64_t value, int64_t position, int64_t extent, int dim) {
  if (value >= 0 && value < extent) return;
  if (extent == 0) {
    fail("{}: index {} at position {} is out of range: dim {} is empty (no index is allowed)", op, value, position,
         dim);
  }
  fail("{}: index {} at position {} is out of range for dim {} of size {} (allowed 0..{}; negative indices are not "
       "supported)",
       op, value, position, dim, extent, extent - 1);
}

void check_accumulating(std::string_view op, DType dtype) {
  SW_CHECK(dtype != DType::Bool, "{}: cannot add bool values (allowed: floating and integer dtypes)", op);
}

int normalize_axis(std::string_view op, int64_t axis, int ndim) {
  SW_CHECK(axis >= -ndim && axis < ndim, "{}: axis {} is out of range for a tensor of rank {} (allowed {}..{})", op,
           axis, ndim, -ndim, ndim - 1);
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

// Adds `src` into `dst` (one element of type T, stored as bytes) in the element's compute type.
template <class T>
inline void add_to(std::byte* dst, const std::byte* src) {
  T a, b;
  std::memcpy(&a, dst, sizeof(T));
  std::memcpy(&b, src, sizeof(T));
  a = static_cast<T>(static_cast<compute_t<T>>(static_cast<compute_t<T>>(a) + static_cast<compute_t<T>>(b)));
  std::memcpy(dst, &a, sizeof(T));
}

// Adds n consecutive elements of src into dst.
void add_elements(DType dtype, std::byte* dst, const std::byte* src, int64_t n) {
  SW_DISPATCH(dtype, [&] {
    if constexpr (std::is_same_v<T, bool>) {
      fail("cannot add bool values");
    } else {
      T* d = reinterpret_cast<T*>(dst);
      const T* s = reinterpret_cast<const T*>(src);
      for (int64_t i = 0; i < n; ++i) {
        d[i] = static_cast<T>(static_cast<compute_t<T>>(static_cast<compute_t<T>>(d[i]) + static_cast<compute_t<T>>(s[i])));
      }
    }
  });
}

// The contiguous strides of `shape` with `axis`'s stride set to 0 (the index supplies it).
Strides strides_without(const Shape& shape, int axis) {
  Strides s = contiguous_strides(shape);
  s[static_cast<size_t>(axis)] = 0;
  return s;
}

// Shared by gather and the scatter_add gradient: for every p of index's shape, to[p in to's
// layout] = from[p with p[axis] = index[p]].
void gather_into(std::string_view op, const Tensor& from, const Tensor& index, int axis, Tensor& to) {
  const Tensor idx = as_i64(index);
  const int64_t* iv = idx.data<int64_t>();
  const auto es = static_cast<int64_t>(dtype_size(from.dtype()));
  const int64_t axis_stride = contiguous_strides(from.shape())[static_cast<size_t>(axis)];
  const int64_t extent = from.shape()[axis];
  const std::byte* src = from.raw();
  std::byte* dst = to.raw();
  int64_t i = 0;
  walk<2>(index.shape(), {strides_without(from.shape(), axis), contiguous_strides(to.shape())},
          [&](const std::array<int64_t, 2>& o) {
            int64_t v = iv[i];
            check_range(op, v, i, extent, axis);
            std::memcpy(dst + o[1] * es, src + (o[0] + v * axis_stride) * es, static_cast<size_t>(es));
            ++i;
          });
}

// Shared by scatter_add and the gather gradient: for every p of index's shape, out[p with p[axis]
// = index[p]] += src[p in src's layout].
void scatter_add_into(std::string_view op, Tensor& out, const Tensor& index, const Tensor& src, int axis) {
  check_accumulating(op, out.dtype());
  const Tensor idx = as_i64(index);
  const int64_t* iv = idx.data<int64_t>();
  const int64_t axis_stride = contiguous_strides(out.shape())[static_cast<size_t>(axis)];
  const int64_t extent = out.shape()[axis];
  SW_DISPATCH(out.dtype(), [&] {
    if constexpr (!std::is_same_v<T, bool>) {
      T* o = out.data<T>();
      const T* s = src.data<T>();
      int64_t i = 0;
      walk<2>(index.shape(), {strides_without(out.shape(), axis), contiguous_strides(src.shape())},
              [&](const std::array<int64_t, 2>& off) {
                int64_t v = iv[i];
                check_range(op, v, i, extent, axis);
                add_to<T>(reinterpret_cast<std::byte*>(o + off[0] + v * axis_stride),
                          reinterpret_cast<const std::byte*>(s + off[1]));
                ++i;
              });
    }
  });
}

void check_defined(std::string_view op, const Tensor& t, std::string_view what) {
  SW_CHECK(t.defined(), "{}: {} is undefined", op, what);
}

void check_same_dtype(std::string_view op, const Tensor& a, std::string_view a_name, const Tensor& b,
                      std::string_view b_name) {
  SW_CHECK(a.dtype() == b.dtype(), "{}: {} holds {} but {} holds {} (allowed: the same dtype)", op, a_name,
           dtype_name(a.dtype()), b_name, dtype_name(b.dtype()));
}

}  // namespace

void check_index_dtype(std::string_view op, std::string_view what, DType dtype) {
  SW_CHECK(dtype == DType::I64 || dtype == DType::I32, "{}: {} must hold integer indices (i64 or i32), got {}", op,
           what, dtype_name(dtype));
}

// ---- index_select ------------------------------------------------------------------------------

int check_index_select_shapes(const Shape& x, const Shape& index, int64_t axis) {
  SW_CHECK(x.ndim() >= 1, "index_select: x must have rank >= 1, got a scalar");
  SW_CHECK(index.ndim() == 1, "index_select: index must be 1-D, got shape {}", index.to_string());
  return normalize_axis("index_select", axis, x.ndim());
}

Shape index_select_shape(const Shape& x, const Shape& index, int64_t axis) {
  int a = check_index_select_shapes(x, index, axis);
  Shape out = x;
  out[a] = index[0];
  return out;
}

Tensor index_select(const Tensor& x, const Tensor& index, int64_t axis) {
  check_index_dtype("index_select", "index", index.dtype());
  Shape out_shape = index_select_shape(x.shape(), index.shape(), axis);
  const int a = x.shape().axis(axis);
  Tensor out(x.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= x.shape()[d];
  for (int d = a + 1; d < x.ndim(); ++d) inner *= x.shape()[d];
  const int64_t n = x.shape()[a], k = index.shape()[0];
  const Tensor idx = as_i64(index);
  const int64_t* iv = idx.data<int64_t>();
  for (int64_t i = 0; i < k; ++i) check_range("index_select", iv[i], i, n, a);
  const auto row = static_cast<size_t>(inner) * dtype_size(x.dtype());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < k; ++i) {
      std::memcpy(out.raw() + static_cast<size_t>(o * k + i) * row, x.raw() + static_cast<size_t>(o * n + iv[i]) * row,
                  row);
    }
  }
  return out;
}

Tensor index_select_backward(const Shape& x_shape, const Tensor& index, const Tensor& dout, int64_t axis) {
  check_index_dtype("index_select backward", "index", index.dtype());
  Shape out_shape = index_select_shape(x_shape, index.shape(), axis);
  SW_CHECK(dout.shape() == out_shape, "index_select backward: dout has shape {}, expected the output shape {}",
           dout.shape().to_string(), out_shape.to_string());
  check_accumulating("index_select backward", dout.dtype());
  const int a = x_shape.axis(axis);
  Tensor dx(dout.dtype(), x_shape);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; ++d) outer *= x_shape[d];
  for (int d = a + 1; d < x_shape.ndim(); ++d) inner *= x_shape[d];
  const int64_t n = x_shape[a], k = index.shape()[0];
  const Tensor idx = as_i64(index);
  const int64_t* iv = idx.data<int64_t>();
  for (int64_t i = 0; i < k; ++i) check_range("index_select backward", iv[i], i, n, a);
  const auto es = static_cast<int64_t>(dtype_size(dout.dtype()));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < k; ++i) {
      add_elements(dout.dtype(), dx.raw() + (o * n + iv[i]) * inner * es, dout.raw() + (o * k + i) * inner * es,
                   inner);
    }
  }
  return dx;
}

// ---- gather ------------------------------------------------------------------------------------

int check_gather_shapes(const Shape& x, const Shape& index, int64_t axis) {
  SW_CHECK(x.ndim() >= 1, "gather: x must have rank >= 1, got a scalar");
  SW_CHECK(index.ndim() == x.ndim(), "gather: index {} must have the rank of x {}", index.to_string(), x.to_string());
  int a = normalize_axis("gather", axis, x.ndim());
  for (int d = 0; d < x.ndim(); ++d) {
    SW_CHECK(d == a || index[d] <= x[d],
             "gather: index {} is larger than x {} in dim {} (allowed: index.shape[d] <= x.shape[d] except on axis {})",
             index.to_string(), x.to_string(), d, a);
  }
  return a;
}

Tensor gather(const Tensor& x, const Tensor& index, int64_t axis) {
  check_index_dtype("gather", "index", index.dtype());
  int a = check_gather_shapes(x.shape(), index.shape(), axis);
  Tensor out(x.dtype(), index.shape());
  gather_into("gather", x, index, a, out);
  return out;
}

Tensor gather_backward(const Shape& x_shape, const Tensor& index, const Tensor& dout, int64_t axis) {
  check_index_dtype("gather backward", "index", index.dtype());
  int a = check_gather_shapes(x_shape, index.shape(), axis);
  SW_CHECK(dout.shape() == index.shape(), "gather backward: dout has shape {}, expected index's shape {}",
           dout.shape().to_string(), index.shape().to_string());
  Tensor dx(dout.dtype(), x_shape);
  scatter_add_into("gather backward", dx, index, dout, a);
  return dx;
}

// ---- scatter_add -------------------------------------------------------------------------------

int check_scatter_add_shapes(const Shape& x, const Shape& index, const Shape& src, int64_t axis) {
  SW_CHECK(x.ndim() >= 1, "scatter_add: x must have rank >= 1, got a scalar");
  SW_CHECK(index.ndim() == x.ndim() && src.ndim() == x.ndim(),
           "scatter_add: x {}, index {} and src {} must have the same rank", x.to_string(), index.to_string(),
           src.to_string());
  int a = normalize_axis("scatter_add", axis, x.ndim());
  for (int d = 0; d < x.ndim(); ++d) {
    SW_CHECK(index[d] <= src[d] && (d == a || index[d] <= x[d]),
             "scatter_add: index {} is larger than src {} or x {} in dim {} (allowed: index.shape[d] <= "
             "src.shape[d], and <= x.shape[d] except on axis {})",
             index.to_string(), src.to_string(), x.to_string(), d, a);
  }
  return a;
}

Tensor scatter_add(const Tensor& x, const Tensor& index, const Tensor& src, int64_t axis) {
  check_index_dtype("scatter_add", "index", index.dtype());
  check_same_dtype("scatter_add", x, "x", src, "src");
  int a = check_scatter_add_shapes(x.shape(), index.shape(), src.shape(), axis);
  Tensor out = x.clone();
  scatter_add_into("scatter_add", out, index, src, a);
  return out;
}

Tensor scatter_add_src_backward(const Shape& src_shape, const Tensor& index, const Tensor& dout, int64_t axis) {
  check_index_dtype("scatter_add backward", "index", index.dtype());
  int a = check_scatter_add_shapes(dout.shape(), index.shape(), src_shape, axis);
  Tensor dsrc(dout.dtype(), src_shape);
  gather_into("scatter_add backward", dout, index, a, dsrc);
  return dsrc;
}

// ---- embedding ---------------------------------------------------------------------------------

Shape embedding_shape(const Shape& ids, const Shape& weight) {
  SW_CHECK(weight.ndim() == 2, "embedding: weight must be 2-D [vocab, hidden], got {}", weight.to_string());
  SW_CHECK(ids.ndim() < kMaxDims, "embedding: ids {} has rank {}; the output would exceed {} dims", ids.to_string(),
           ids.ndim(), kMaxDims);
  Shape out = ids;
  out.push_back(weight[1]);
  return out;
}

namespace {

// `ids` as i64, after checking every id against [0, vocab_size) in order (the first bad one is
// named) and the block [offset, offset + rows) against the vocab.
Tensor checked_ids(std::string_view op, const Tensor& ids, int64_t offset, int64_t rows, int64_t vocab_size) {
  check_index_dtype(op, "ids", ids.dtype());
  SW_CHECK(offset >= 0 && rows >= 0 && offset + rows <= vocab_size,
           "{}: the weight block [{}, {}) does not fit a vocab of {} rows", op, offset, offset + rows, vocab_size);
  Tensor idx = as_i64(ids);
  const int64_t* iv = idx.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    int64_t v = iv[i];
    if (v < 0 || v >= vocab_size) {
      fail("{}: id {} at position {} is out of range for a vocab of {} rows (allowed 0..{})", op, v, i, vocab_size,
           vocab_size - 1);
    }
  }
  return idx;
}

}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& weight, int64_t vocab_offset, int64_t vocab_size) {
  Shape out_shape = embedding_shape(ids.shape(), weight.shape());
  Tensor out(weight.dtype(), out_shape);
  const int64_t rows = weight.shape()[0];
  const auto row = static_cast<size_t>(weight.shape()[1]) * dtype_size(weight.dtype());
  const int64_t grain = kParallelGrain / std::max<int64_t>(weight.shape()[1], 1) + 1;
  const Tensor idx = checked_ids("embedding", ids, vocab_offset, rows, vocab_size);
  const int64_t* iv = idx.data<int64_t>();
  parallel_for(ids.numel(), grain, [&](int64_t b, int64_t e) {  // positions split over the rank's threads
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = iv[i] - vocab_offset;
      if (r >= 0 && r < rows)
        std::memcpy(out.raw() + static_cast<size_t>(i) * row, weight.raw() + static_cast<size_t>(r) * row, row);
    }
  });
  return out;
}

Tensor embedding_backward(const Tensor& ids, const Tensor& dout, const Shape& weight_shape, int64_t vocab_offset,
                          int64_t vocab_size) {
  Shape out_shape = embedding_shape(ids.shape(), weight_shape);
  SW_CHECK(dout.shape() == out_shape, "embedding backward: dout has shape {}, expected {}", dout.shape().to_string(),
           out_shape.to_string());
  check_accumulating("embedding backward", dout.dtype());
  Tensor dw(dout.dtype(), weight_shape);
  const int64_t h = weight_shape[1], rows = weight_shape[0], n = ids.numel();
  const auto es = static_cast<int64_t>(dtype_size(dout.dtype()));
  // The scatter-add: threads take disjoint ranges of the hidden columns (cut at multiples of 16, so
  // no two threads write one cache line), and each adds every position's row into its columns in
  // position order (the sums of a single loop, on any thread count).
  const Tensor idx = checked_ids("embedding backward", ids, vocab_offset, rows, vocab_size);
  const int64_t* iv = idx.data<int64_t>();
  parallel_for_cuts(h, kParallelGrain / std::max<int64_t>(n, 1) + 1, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = iv[i] - vocab_offset;
      if (r >= 0 && r < rows)
        add_elements(dout.dtype(), dw.raw() + (r * h + c0) * es, dout.raw() + (i * h + c0) * es, c1 - c0);
    }
  });
  return dw;
}

// ---- index_put ---------------------------------------------------------------------------------

Shape index_put_index_shape(const Shape& x, std::span<const Shape> index_shapes, const Shape& value) {
  const auto k = static_cast<int>(index_shapes.size());
  SW_CHECK(k >= 1 && k <= x.ndim(), "index_put: {} index tensors for x {} of rank {} (allowed 1..{})", k,
           x.to_string(), x.ndim(), x.ndim());
  Shape b = index_shapes[0];
  for (int j = 1; j < k; ++j) b = broadcast_shapes(b, index_shapes[static_cast<size_t>(j)]);
  SW_CHECK(b.ndim() + x.ndim() - k <= kMaxDims,
           "index_put: the indexed shape {} and x's trailing dims exceed {} dims", b.to_string(), kMaxDims);
  Shape full = b;
  for (int d = k; d < x.ndim(); ++d) full.push_back(x[d]);
  SW_CHECK(broadcasts_to(value, full),
           "index_put: value {} does not broadcast to {} (the broadcast index shape {} followed by x {}'s dims after "
           "the {} indexed ones)",
           value.to_string(), full.to_string(), b.to_string(), x.to_string(), k);
  return b;
}

namespace {

struct PutPlan {
  Shape b, full;
  int64_t inner = 1;                  // elements per indexed block of x (x.shape[k:])
  std::vector<Tensor> idx;            // indices as i64
  Strides value_strides{};            // value read as `full`
  std::vector<int64_t> value_inner;   // value offset of each element of a block
};

PutPlan plan_put(std::string_view op, const Shape& x, std::span<const Tensor> indices, const Shape& value) {
  PutPlan p;
  std::array<Shape, kMaxDims> shapes;
  SW_CHECK(!indices.empty() && indices.size() <= static_cast<size_t>(x.ndim()),
           "{}: {} index tensors for x {} of rank {} (allowed 1..{})", op, indices.size(), x.to_string(), x.ndim(),
           x.ndim());
  for (size_t j = 0; j < indices.size(); ++j) {
    check_index_dtype(op, "indices", indices[j].dtype());
    shapes[j] = indices[j].shape();
    p.idx.push_back(as_i64(indices[j]));
  }
  p.b = index_put_index_shape(x, std::span<const Shape>(shapes.data(), indices.size()), value);
  p.full = p.b;
  const auto k = static_cast<int>(indices.size());
  Shape trailing;
  for (int d = k; d < x.ndim(); ++d) {
    p.full.push_back(x[d]);
    trailing.push_back(x[d]);
    p.inner *= x[d];
  }
  p.value_strides = broadcast_strides(value, p.full);
  Strides ts{};
  for (int d = 0; d < trailing.ndim(); ++d) ts[static_cast<size_t>(d)] = p.value_strides[static_cast<size_t>(p.b.ndim() + d)];
  p.value_inner.reserve(static_cast<size_t>(p.inner));
  walk<1>(trailing, {ts}, [&](const std::array<int64_t, 1>& o) { p.value_inner.push_back(o[0]); });
  return p;
}

// Calls fn(b, x_base, value_base) for every b of B in row-major order: x_base is the flat offset of
// the indexed block of x, value_base the offset of value[b, 0, ...].
template <class Fn>
void for_each_put(std::string_view op, const PutPlan& p, const Shape& x, Fn&& fn) {
  const size_t k = p.idx.size();
  std::array<Strides, kMaxDims + 1> strides{};
  for (size_t j = 0; j < k; ++j) strides[j] = broadcast_strides(p.idx[j].shape(), p.b);
  for (int d = 0; d < p.b.ndim(); ++d) {
    strides[kMaxDims][static_cast<size_t>(d)] = p.value_strides[static_cast<size_t>(d)];
  }
  const Strides xs = contiguous_strides(x);
  std::array<const int64_t*, kMaxDims> iv{};
  for (size_t j = 0; j < k; ++j) iv[j] = p.idx[j].data<int64_t>();
  int64_t b = 0;
  walk<kMaxDims + 1>(p.b, strides, [&](const std::array<int64_t, kMaxDims + 1>& o) {
    int64_t base = 0;
    for (size_t j = 0; j < k; ++j) {
      int64_t v = iv[j][o[j]];
      check_range(op, v, b, x[static_cast<int>(j)], static_cast<int>(j));
      base += v * xs[j];
    }
    fn(b, base, o[kMaxDims]);
    ++b;
  });
}

}  // namespace

Tensor index_put(const Tensor& x, std::span<const Tensor> indices, const Tensor& value, bool accumulate) {
  check_same_dtype("index_put", x, "x", value, "value");
  if (accumulate) check_accumulating("index_put (accumulate)", x.dtype());
  PutPlan p = plan_put("index_put", x.shape(), indices, value.shape());
  Tensor out = x.clone();
  const auto es = static_cast<int64_t>(dtype_size(x.dtype()));
  std::byte* o = out.raw();
  const std::byte* v = value.raw();
  for_each_put("index_put", p, x.shape(), [&](int64_t, int64_t base, int64_t vbase) {
    for (int64_t r = 0; r < p.inner; ++r) {
      std::byte* dst = o + (base + r) * es;
      const std::byte* src = v + (vbase + p.value_inner[static_cast<size_t>(r)]) * es;
      if (accumulate) {
        add_elements(x.dtype(), dst, src, 1);
      } else {
        std::memcpy(dst, src, static_cast<size_t>(es));
      }
    }
  });
  return out;
}

IndexPutGrads index_put_backward(const Tensor& dout, std::span<const Tensor> indices, const Shape& value_shape,
                                 bool accumulate) {
  check_defined("index_put backward", dout, "dout");
  check_accumulating("index_put backward", dout.dtype());
  PutPlan p = plan_put("index_put backward", dout.shape(), indices, value_shape);
  IndexPutGrads g;
  g.x = dout.clone();
  Tensor full(dout.dtype(), p.full);
  const auto es = static_cast<int64_t>(dtype_size(dout.dtype()));
  const auto block = static_cast<size_t>(p.inner * es);
  // Reads dout (never the zeroed copy), so a duplicate position gathers the same block again.
  for_each_put("index_put backward", p, dout.shape(), [&](int64_t b, int64_t base, int64_t) {
    std::memcpy(full.raw() + b * p.inner * es, dout.raw() + base * es, block);
    if (!accumulate) std::memset(g.x.raw() + base * es, 0, block);
  });
  g.value = reduce_to_shape(full, value_shape);
  return g;
}

}  // namespace shardwise::ops
