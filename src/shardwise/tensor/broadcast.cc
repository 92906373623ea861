#include "shardwise/tensor/broadcast.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise {

namespace {

// Broadcasts `b` into `out` in place; returns the first clashing dim (counted in `out`) or -1.
int broadcast_into(Shape& out, const Shape& b) {
  Shape merged;
  const int nd = std::max(out.ndim(), b.ndim());
  for (int d = 0; d < nd; ++d) {
    int da = d - (nd - out.ndim()), db = d - (nd - b.ndim());
    int64_t ea = da >= 0 ? out[da] : 1, eb = db >= 0 ? b[db] : 1;
    if (ea != eb && ea != 1 && eb != 1) return d;
    merged.push_back(ea == 1 ? eb : ea);
  }
  out = merged;
  return -1;
}

// The number of trailing elements kept when `grad` reduces to `shape` by summing only over
// leading dims (shape right-aligned: some 1s or missing dims, then grad's trailing extents);
// 0 when the reduction has another form, or when nothing is kept whole.
int64_t kept_suffix(const Shape& grad, const Shape& shape) {
  const int lead = grad.ndim() - shape.ndim();
  int split = grad.ndim();  // first dim of grad from which shape's extents equal grad's
  while (split > 0 && split - 1 - lead >= 0 && shape[split - 1 - lead] == grad[split - 1]) --split;
  for (int d = lead; d < split; ++d) {
    if (shape[d - lead] != 1) return 0;
  }
  int64_t cols = 1;
  for (int d = split; d < grad.ndim(); ++d) cols *= grad[d];
  return split == grad.ndim() || cols == 0 ? 0 : cols;
}

// out[j] = sum of the grad elements that broadcast from element j of out.
template <class T>
void sum_into(const Tensor& grad, Tensor& out) {
  if constexpr (std::is_same_v<T, bool>) {
    fail("reduce_to_shape: cannot sum a bool gradient (shape {} to {})", grad.shape().to_string(),
         out.shape().to_string());
  } else {
    using Acc = std::conditional_t<is_float_v<T>, double, compute_t<T>>;
    std::vector<Acc> acc(static_cast<size_t>(out.numel()), Acc{});
    const T* g = grad.data<T>();
    const int64_t cols = kept_suffix(grad.shape(), out.shape());
    if (cols > 0) {
      // Leading dims summed, trailing dims kept (a bias gradient): column sums, rows in order (the
      // order of the general walk below, so the same sums), in a loop that vectorizes.
      // Threads take disjoint ranges of columns, each summed over the rows in order: the same sums.
      const int64_t rows = grad.numel() / cols;
      Acc* a = acc.data();
      parallel_columns(cols, kParallelGrain / std::max<int64_t>(rows, 1) + 1, [&](int64_t c0, int64_t c1) {
        const int64_t w = c1 - c0;
        std::vector<Acc> sums(static_cast<size_t>(w), Acc{});
        Acc* t = sums.data();
        for (int64_t r = 0; r < rows; ++r) {
          const T* row = g + r * cols + c0;
          for (int64_t j = 0; j < w; ++j) t[j] += static_cast<Acc>(static_cast<compute_t<T>>(row[j]));
        }
        std::copy(t, t + w, a + c0);
      });
    } else {
      broadcast_for_each<2>(grad.shape(), {grad.shape(), out.shape()}, [&](int64_t, const std::array<int64_t, 2>& o) {
      acc[static_cast<size_t>(o[1])] += static_cast<Acc>(static_cast<compute_t<T>>(g[o[0]]));
      });
    }
    T* dst = out.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) dst[i] = static_cast<T>(static_cast<compute_t<T>>(acc[i]));
  }
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  Shape out = a;
  int bad = broadcast_into(out, b);
  SW_CHECK(bad < 0,
           "shapes {} and {} do not broadcast: aligned from the right, dim {} of the result has "
           "extents that differ and are not 1",
           a.to_string(), b.to_string(), bad);
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const Shape& c) {
  Shape out = a;
  bool ok = broadcast_into(out, b) < 0 && broadcast_into(out, c) < 0;
  SW_CHECK(ok, "shapes {}, {} and {} do not broadcast together: aligned from the right, every dim must "
           "have equal extents or 1",
           a.to_string(), b.to_string(), c.to_string());
  return out;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.ndim() > to.ndim()) return false;
  const int lead = to.ndim() - from.ndim();
  for (int d = 0; d < from.ndim(); ++d) {
    if (from[d] != 1 && from[d] != to[d + lead]) return false;
  }
  return true;
}

std::array<int64_t, kMaxDims> broadcast_strides(const Shape& in, const Shape& out) {
  SW_CHECK(broadcasts_to(in, out), "shape {} does not broadcast to {}", in.to_string(), out.to_string());
  std::array<int64_t, kMaxDims> strides{};
  const auto own = contiguous_strides(in);
  const int lead = out.ndim() - in.ndim();
  for (int d = 0; d < in.ndim(); ++d) {
    // A size-1 dim against a larger extent repeats: stride 0. (Equal extents of 1 keep stride; it
    // is never stepped since the index stays 0.)
    bool repeated = in[d] == 1 && out[d + lead] != 1;
    strides[static_cast<size_t>(d + lead)] = repeated ? 0 : own[static_cast<size_t>(d)];
  }
  return strides;
}

Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) {
  SW_CHECK(grad.defined(), "reduce_to_shape: the gradient is undefined");
  SW_CHECK(broadcasts_to(shape, grad.shape()),
           "reduce_to_shape: an operand of shape {} does not broadcast to the gradient's shape {}",
           shape.to_string(), grad.shape().to_string());
  if (shape == grad.shape()) return grad;
  Tensor out(grad.dtype(), shape);
  SW_DISPATCH(grad.dtype(), [&] { sum_into<T>(grad, out); });
  return out;
}

}  // namespace shardwise
