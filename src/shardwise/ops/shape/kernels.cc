#include "shardwise/ops/shape/kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <variant>

#include "shardwise/core/error.h"
#include "shardwise/tensor/broadcast.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

std::span<const int64_t> attr_ints(const Attrs& attrs, std::string_view name, int64_t& scratch, std::string_view op) {
  const AttrValue* v = attrs.find(name);
  if (v == nullptr) return {};
  if (const auto* list = std::get_if<std::vector<int64_t>>(v)) return *list;
  if (const auto* one = std::get_if<int64_t>(v)) {
    scratch = *one;
    return {&scratch, 1};
  }
  fail("{}: attribute '{}' must be an int list such as [0,1], got {}", op, name, attrs.to_string());
}

namespace {

// Normalizes `axis` into [0, ndim); Error naming the op, the attribute and the allowed range.
int norm_axis(int64_t axis, int ndim, std::string_view op, std::string_view what) {
  SW_CHECK(axis >= -ndim && axis < ndim, "{}: {} {} is out of range for rank {} (allowed {}..{})", op, what, axis, ndim,
           -ndim, ndim - 1);
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

// Calls fn(o, s) for every element o (row-major) of `out`, where s is the flat index of element
// (i_0 % src[0], ..., i_n % src[n]) of a contiguous tensor of extents `src` (same rank as out;
// extent 1 repeats). An odometer: constant work per element.
template <class Fn>
void modulo_walk(const Shape& out, const Shape& src, Fn&& fn) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int nd = out.ndim();
  const auto ss = contiguous_strides(src);
  std::array<int64_t, kMaxDims> idx{}, sidx{};
  int64_t s = 0;
  for (int64_t o = 0; o < total; ++o) {
    fn(o, s);
    for (int d = nd - 1; d >= 0; --d) {
      auto u = static_cast<size_t>(d);
      if (++idx[u] < out[d]) {
        if (++sidx[u] == src[d]) {
          s -= (sidx[u] - 1) * ss[u];
          sidx[u] = 0;
        } else {
          s += ss[u];
        }
        break;
      }
      s -= sidx[u] * ss[u];
      sidx[u] = 0;
      idx[u] = 0;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- reshape family

DimTransform reshape_transform(const Shape& in, const Shape& out) {
  SW_CHECK(in.numel() == out.numel(), "reshape: shapes {} and {} hold different element counts ({} and {})",
           in.to_string(), out.to_string(), in.numel(), out.numel());
  DimTransform t;
  const int ni = in.ndim(), no = out.ndim();
  const bool empty = in.numel() == 0;
  auto add = [&](int i0, int i1, int j0, int j1) {
    t.groups[static_cast<size_t>(t.count++)] = {static_cast<int8_t>(i0), static_cast<int8_t>(i1),
                                                static_cast<int8_t>(j0), static_cast<int8_t>(j1)};
  };
  int i = 0, j = 0;
  while (i < ni || j < no) {
    if (i < ni && j < no && in[i] == out[j]) {
      add(i, i + 1, j, j + 1), ++i, ++j;
    } else if (i < ni && in[i] == 1) {
      add(i, i + 1, j, j), ++i;
    } else if (j < no && out[j] == 1) {
      add(i, i, j, j + 1), ++j;
    } else if (empty) {
      add(i, ni, j, no);  // no elements: whatever is left is one group
      break;
    } else {
      // Both sides have extents > 1 here (equal products guarantee more dims on each side).
      int i0 = i, j0 = j;
      int64_t pin = in[i++], pout = out[j++];
      while (pin != pout) {
        if (pin < pout) {
          pin *= in[i++];
        } else {
          pout *= out[j++];
        }
      }
      add(i0, i, j0, j);
    }
  }
  return t;
}

Shape local_reshape_shape(const Shape& global_in, const Shape& global_out, const Shape& local_in, std::string_view op) {
  SW_CHECK(local_in.ndim() == global_in.ndim(), "{}: the local input has rank {} but the global input {} rank {}", op,
           local_in.ndim(), global_in.to_string(), global_in.ndim());
  Shape local = global_out;
  const DimTransform t = reshape_transform(global_in, global_out);
  auto bad = [&](int d) {
    fail(
        "{}: a shard {} of {} is sharded along dim {}, which does not reshape to a block of {}; that dim must be "
        "Replicate",
        op, local_in.to_string(), global_in.to_string(), d, global_out.to_string());
  };
  for (const DimGroup& g : t.view()) {
    if (g.in_count() == 0) continue;  // a new extent-1 dim
    // The shard must be one contiguous range of the group: single entries, then any extent, then
    // whole dims ([1, .., 1, k, n, .., n]).
    int64_t count = 1, rest = 1;
    bool whole_from_here = false;
    for (int d = g.in_begin; d < g.in_end; ++d) {
      if (whole_from_here && local_in[d] != global_in[d]) bad(d);
      if (local_in[d] != 1) whole_from_here = true;
      count *= local_in[d];
    }
    if (g.out_count() == 0) {
      if (local_in[g.in_begin] != 1) bad(g.in_begin);
      continue;
    }
    int64_t group_numel = 1;
    for (int d = g.in_begin; d < g.in_end; ++d) group_numel *= global_in[d];
    if (group_numel == 0) {
      if (local_in[g.in_begin] != global_in[g.in_begin]) bad(g.in_begin);
      continue;  // keeps the global extents
    }
    for (int d = g.out_begin + 1; d < g.out_end; ++d) rest *= global_out[d];
    if (count % rest == 0) {
      local[g.out_begin] = count / rest;
      continue;
    }
    // Less than the whole trailing dims: the same range as [1, .., 1, k, n, .., n] of the output.
    for (int d = g.out_end - 1; d >= g.out_begin; --d) {
      if (count % global_out[d] == 0) {
        count /= global_out[d];
        continue;
      }
      if (count > global_out[d]) bad(g.in_begin);
      local[d] = count;
      for (int e = g.out_begin; e < d; ++e) local[e] = 1;
      break;
    }
  }
  return local;
}

Tensor reshape_local(const Tensor& x, const Shape& global_in, const Shape& global_out, std::string_view op) {
  // A view: kernels never write their inputs, so sharing the storage is safe.
  return x.reshaped(local_reshape_shape(global_in, global_out, x.shape(), op));
}

Shape reshape_shape(const Shape& in, const Attrs& attrs) {
  SW_CHECK(attrs.has("shape"), "reshape: the attribute 'shape' (target extents, one -1 allowed) is required");
  int64_t scratch = 0;
  std::span<const int64_t> spec = attr_ints(attrs, "shape", scratch, "reshape");
  SW_CHECK(spec.size() <= static_cast<size_t>(kMaxDims), "reshape: target shape {} has more than {} dims",
           attrs.to_string(), kMaxDims);
  int infer = -1;
  int64_t known = 1;
  for (size_t k = 0; k < spec.size(); ++k) {
    if (spec[k] == -1) {
      SW_CHECK(infer < 0, "reshape: shape {} has more than one -1; at most one extent can be inferred",
               attrs.to_string());
      infer = static_cast<int>(k);
    } else {
      SW_CHECK(spec[k] >= 0, "reshape: extent {} in shape {} is negative (only -1 is allowed, once)", spec[k],
               attrs.to_string());
      SW_CHECK(!__builtin_mul_overflow(known, spec[k], &known), "reshape: shape {} is too large", attrs.to_string());
    }
  }
  const int64_t numel = in.numel();
  Shape out;
  for (size_t k = 0; k < spec.size(); ++k) {
    if (static_cast<int>(k) != infer) {
      out.push_back(spec[k]);
      continue;
    }
    SW_CHECK(known != 0 && numel % known == 0,
             "reshape: cannot infer the -1 in shape {} for an input {} of {} elements (the other extents multiply "
             "to {})",
             attrs.to_string(), in.to_string(), numel, known);
    out.push_back(numel / known);
  }
  SW_CHECK(out.numel() == numel, "reshape: an input {} ({} elements) cannot be viewed as {} ({} elements)",
           in.to_string(), numel, out.to_string(), out.numel());
  return out;
}

Shape squeeze_shape(const Shape& in, const Attrs& attrs) {
  int64_t scratch = 0;
  std::span<const int64_t> axes = attr_ints(attrs, "axis", scratch, "squeeze");
  uint32_t drop = 0;
  for (int64_t a : axes) {
    int d = norm_axis(a, in.ndim(), "squeeze", "axis");
    SW_CHECK(!(drop & (1u << d)), "squeeze: axis {} is listed twice for an input {}", a, in.to_string());
    SW_CHECK(in[d] == 1, "squeeze: dim {} of the input {} has extent {}; only extent-1 dims can be squeezed", d,
             in.to_string(), in[d]);
    drop |= 1u << d;
  }
  Shape out;
  for (int d = 0; d < in.ndim(); ++d) {
    bool dropped = axes.empty() ? in[d] == 1 : (drop >> d) & 1u;
    if (!dropped) out.push_back(in[d]);
  }
  return out;
}

Shape unsqueeze_shape(const Shape& in, const Attrs& attrs) {
  int64_t scratch = 0;
  std::span<const int64_t> axes = attr_ints(attrs, "axis", scratch, "unsqueeze");
  SW_CHECK(!axes.empty(), "unsqueeze: the attribute 'axis' (positions of the new dims in the output) is required");
  const int nd = in.ndim() + static_cast<int>(axes.size());
  SW_CHECK(nd <= kMaxDims, "unsqueeze: an input {} with {} new dims exceeds {} dims", in.to_string(), axes.size(),
           kMaxDims);
  uint32_t added = 0;
  for (int64_t a : axes) {
    int d = norm_axis(a, nd, "unsqueeze", "axis");
    SW_CHECK(!(added & (1u << d)), "unsqueeze: output position {} is listed twice", d);
    added |= 1u << d;
  }
  Shape out;
  for (int d = 0, k = 0; d < nd; ++d) out.push_back((added >> d) & 1u ? 1 : in[k++]);
  return out;
}

Shape flatten_shape(const Shape& in, const Attrs& attrs) {
  int64_t start = attrs.get_int("start_axis", 0), stop = attrs.get_int("stop_axis", -1);
  if (in.ndim() == 0) {
    SW_CHECK((start == 0 || start == -1) && (stop == 0 || stop == -1),
             "flatten: a scalar input takes start_axis and stop_axis 0 or -1, got {} and {}", start, stop);
    return Shape{1};
  }
  int s = norm_axis(start, in.ndim(), "flatten", "start_axis"), e = norm_axis(stop, in.ndim(), "flatten", "stop_axis");
  SW_CHECK(s <= e, "flatten: start_axis {} comes after stop_axis {} for an input {}", start, stop, in.to_string());
  Shape out;
  for (int d = 0; d < s; ++d) out.push_back(in[d]);
  int64_t merged = 1;
  for (int d = s; d <= e; ++d) merged *= in[d];
  out.push_back(merged);
  for (int d = e + 1; d < in.ndim(); ++d) out.push_back(in[d]);
  return out;
}

// ---------------------------------------------------------------- transpose

Perm Perm::inverse() const {
  Perm p;
  p.n = n;
  for (int j = 0; j < n; ++j) p.to[static_cast<size_t>(to[static_cast<size_t>(j)])] = static_cast<int8_t>(j);
  return p;
}

Perm transpose_perm(const Shape& in, const Attrs& attrs) {
  int64_t scratch = 0;
  std::span<const int64_t> perm = attr_ints(attrs, "perm", scratch, "transpose");
  SW_CHECK(attrs.has("perm") && static_cast<int>(perm.size()) == in.ndim(),
           "transpose: perm must list each of the {} dims of the input {} once, got {}", in.ndim(), in.to_string(),
           attrs.to_string());
  Perm p;
  p.n = in.ndim();
  uint32_t seen = 0;
  for (int j = 0; j < p.n; ++j) {
    int d = norm_axis(perm[static_cast<size_t>(j)], p.n, "transpose", "perm entry");
    SW_CHECK(!(seen & (1u << d)), "transpose: perm {} lists dim {} twice; it must be a permutation", attrs.to_string(),
             d);
    seen |= 1u << d;
    p.to[static_cast<size_t>(j)] = static_cast<int8_t>(d);
  }
  return p;
}

Shape transpose_shape(const Shape& in, const Perm& perm) {
  Shape out;
  for (int j = 0; j < perm.n; ++j) out.push_back(in[perm.to[static_cast<size_t>(j)]]);
  return out;
}

Tensor transpose(const Tensor& x, const Perm& perm) {
  SW_CHECK(perm.n == x.ndim(), "transpose: a permutation of {} dims for an input {}", perm.n, x.shape().to_string());
  const Shape out_shape = transpose_shape(x.shape(), perm);
  Tensor out = Tensor::uninitialized(x.dtype(), out_shape);
  const auto xs = contiguous_strides(x.shape());
  std::array<int64_t, kMaxDims> strides{};  // x's stride along each output dim
  for (int j = 0; j < perm.n; ++j)
    strides[static_cast<size_t>(j)] = xs[static_cast<size_t>(perm.to[static_cast<size_t>(j)])];
  const int64_t total = out.numel();
  if (total == 0) return out;
  // Calls copy(o, s) for flat index o of `out` (stepping by `step`) and x's offset s, walking the
  // first `nd` output dims like an odometer: no division per element. The steps are split over the
  // rank's threads (each writes its own range of `out`), each range starting from its first index.
  auto walk = [&](int nd, int64_t step, auto&& copy) {
    parallel_for(total / step, kParallelGrain / step + 1, [&](int64_t i0, int64_t i1) {
      std::array<int64_t, kMaxDims> idx{};
      int64_t s = 0;
      for (int64_t rest = i0, d = nd - 1; d >= 0; --d) {
        auto u = static_cast<size_t>(d);
        idx[u] = rest % out_shape[static_cast<int>(d)];
        rest /= out_shape[static_cast<int>(d)];
        s += idx[u] * strides[u];
      }
      for (int64_t o = i0 * step; o < i1 * step; o += step) {
        copy(o, s);
        for (int d = nd - 1; d >= 0; --d) {
          auto u = static_cast<size_t>(d);
          s += strides[u];
          if (++idx[u] < out_shape[d]) break;
          s -= strides[u] * out_shape[d];
          idx[u] = 0;
        }
      }
    });
  };
  if (perm.n >= 2 && perm.to[static_cast<size_t>(perm.n - 1)] == perm.n - 1) {
    // The last dim stays last: copy whole rows of it (head splits and merges: [B, S, NH, HD] <->
    // [B, NH, S, HD]).
    const auto elem = static_cast<int64_t>(dtype_size(x.dtype()));
    const int64_t run = out_shape[perm.n - 1];
    const std::byte* src = x.raw();
    std::byte* dst = out.raw();
    walk(perm.n - 1, run, [&](int64_t o, int64_t s) {
      std::memcpy(dst + o * elem, src + s * elem, static_cast<size_t>(run * elem));
    });
    return out;
  }
  SW_DISPATCH(x.dtype(), [&] {
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    walk(perm.n, 1, [&](int64_t o, int64_t s) { dst[o] = src[s]; });
  });
  return out;
}

// ---------------------------------------------------------------- expand

Shape expand_shape(const Shape& in, const Attrs& attrs) {
  SW_CHECK(attrs.has("shape"), "expand: the attribute 'shape' (the broadcast target, -1 keeps a dim) is required");
  int64_t scratch = 0;
  std::span<const int64_t> spec = attr_ints(attrs, "shape", scratch, "expand");
  const int nd = static_cast<int>(spec.size());
  SW_CHECK(nd >= in.ndim() && nd <= kMaxDims,
           "expand: target {} must have at least the input's rank {} (and at most {})", attrs.to_string(), in.ndim(),
           kMaxDims);
  const int lead = nd - in.ndim();
  Shape out;
  for (int j = 0; j < nd; ++j) {
    int64_t want = spec[static_cast<size_t>(j)];
    if (j < lead) {
      SW_CHECK(want >= 0, "expand: new leading dim {} of target {} needs an extent >= 0 (-1 keeps only existing dims)",
               j, attrs.to_string());
      out.push_back(want);
      continue;
    }
    int64_t have = in[j - lead];
    SW_CHECK(want == -1 || want == have || (have == 1 && want >= 0),
             "expand: cannot expand an input {} to {}: dim {} has extent {} and target {}; only an extent 1 "
             "broadcasts (-1 keeps the extent)",
             in.to_string(), attrs.to_string(), j - lead, have, want);
    out.push_back(want == -1 ? have : want);
  }
  return out;
}

namespace {
// x's local extents as the local output sees them: 1:1 dims keep the local extent, broadcast and
// leading dims take the global target extent (they are whole on the output).
Shape expand_local_target(const Shape& local_in, const Shape& global_in, const Shape& global_out) {
  SW_CHECK(local_in.ndim() == global_in.ndim() && global_in.ndim() <= global_out.ndim(),
           "expand: a local input {} for a global input {} expanded to {}", local_in.to_string(), global_in.to_string(),
           global_out.to_string());
  Shape out = global_out;
  const int lead = global_out.ndim() - global_in.ndim();
  for (int d = 0; d < global_in.ndim(); ++d) {
    if (!expand_broadcasts(global_in, global_out, d)) {
      out[d + lead] = local_in[d];
    } else {
      SW_CHECK(local_in[d] == 1,
               "expand: dim {} of the input {} is broadcast but its shard has extent {}; it must be "
               "Replicate",
               d, global_in.to_string(), local_in[d]);
    }
  }
  return out;
}
}  // namespace

Tensor expand_local(const Tensor& x, const Shape& global_in, const Shape& global_out) {
  const Shape target = expand_local_target(x.shape(), global_in, global_out);
  Tensor out(x.dtype(), target);
  SW_DISPATCH(x.dtype(), [&] {
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    broadcast_for_each<1>(target, {x.shape()}, [&](int64_t o, const std::array<int64_t, 1>& s) { dst[o] = src[s[0]]; });
  });
  return out;
}

Tensor expand_backward_local(const Tensor& dout, const Shape& global_in, const Shape& global_out) {
  SW_CHECK(dout.ndim() == global_out.ndim(), "expand backward: dout {} for an output {}", dout.shape().to_string(),
           global_out.to_string());
  const int lead = global_out.ndim() - global_in.ndim();
  Shape dx;
  for (int d = 0; d < global_in.ndim(); ++d) {
    dx.push_back(expand_broadcasts(global_in, global_out, d) ? 1 : dout.shape()[d + lead]);
  }
  Tensor g = reduce_to_shape(dout, dx);
  return g.raw() == dout.raw() ? g.clone() : g;  // never alias the gradient with dout
}

// ---------------------------------------------------------------- concat / split / stack

int concat_axis(const Attrs& attrs, int ndim, std::string_view op) {
  SW_CHECK(ndim > 0, "{}: inputs must have rank >= 1, got a scalar", op);
  return norm_axis(attrs.get_int("axis", 0), ndim, op, "axis");
}

void check_concat_operand(const Shape& first, DType first_dtype, const Shape& other, DType dtype, int axis,
                          size_t index, std::string_view op) {
  bool ok = other.ndim() == first.ndim() && dtype == first_dtype;
  for (int d = 0; ok && d < first.ndim(); ++d) ok = d == axis || other[d] == first[d];
  SW_CHECK(ok,
           "{}: input {} is {} {} but input 0 is {} {}; all inputs need one dtype and equal extents except "
           "along axis {}",
           op, index, dtype_name(dtype), other.to_string(), dtype_name(first_dtype), first.to_string(), axis);
}

Tensor concat(std::span<const Tensor> xs, int axis) {
  SW_CHECK(!xs.empty(), "concat: needs at least one input");
  Shape shape = xs[0].shape();
  shape[axis] = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    check_concat_operand(xs[0].shape(), xs[0].dtype(), xs[k].shape(), xs[k].dtype(), axis, k, "concat");
    shape[axis] += xs[k].shape()[axis];
  }
  Tensor out(xs[0].dtype(), shape);
  std::array<int64_t, kMaxDims> off{};
  for (const Tensor& x : xs) {
    out.paste(x, {off.data(), shape.size()});
    off[static_cast<size_t>(axis)] += x.shape()[axis];
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int axis, std::span<const int64_t> sizes) {
  std::array<int64_t, kMaxDims> off{};
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  for (int64_t size : sizes) {
    Shape piece = x.shape();
    piece[axis] = size;
    out.push_back(x.slice({off.data(), piece.size()}, piece));
    off[static_cast<size_t>(axis)] += size;
  }
  SW_CHECK(off[static_cast<size_t>(axis)] == x.shape()[axis], "split: pieces of {} elements for an extent {}",
           off[static_cast<size_t>(axis)], x.shape()[axis]);
  return out;
}

int split_count(const Shape& in, const Attrs& attrs) {
  const bool has_sections = attrs.has("sections"), has_num = attrs.has("num");
  SW_CHECK(has_sections != has_num,
           "split: give exactly one of 'sections' (extents, one -1 allowed) or 'num' (equal "
           "parts), got {}",
           attrs.to_string());
  int axis = concat_axis(attrs, in.ndim(), "split");
  if (has_num) {
    int64_t num = attrs.get_int("num");
    SW_CHECK(num >= 1 && in[axis] % num == 0, "split: num={} must be >= 1 and divide extent {} of dim {} of {}", num,
             in[axis], axis, in.to_string());
    return static_cast<int>(num);
  }
  int64_t scratch = 0;
  std::span<const int64_t> sections = attr_ints(attrs, "sections", scratch, "split");
  SW_CHECK(!sections.empty(), "split: 'sections' must list at least one extent");
  int64_t known = 0;
  int infer = 0;
  for (int64_t s : sections) {
    SW_CHECK(s >= -1, "split: section extent {} is negative (only one -1 is allowed)", s);
    if (s == -1) {
      ++infer;
    } else {
      known += s;
    }
  }
  SW_CHECK(infer <= 1 && (infer ? known <= in[axis] : known == in[axis]),
           "split: sections {} must add up to extent {} of dim {} of {} (one -1 may take the rest)", attrs.to_string(),
           in[axis], axis, in.to_string());
  return static_cast<int>(sections.size());
}

std::vector<int64_t> split_sizes(const Shape& in, const Attrs& attrs) {
  const int count = split_count(in, attrs);
  const int axis = concat_axis(attrs, in.ndim(), "split");
  if (attrs.has("num")) return std::vector<int64_t>(static_cast<size_t>(count), in[axis] / count);
  std::vector<int64_t> sizes = attrs.get_ints("sections");
  int64_t known = 0;
  for (int64_t s : sizes) known += s == -1 ? 0 : s;
  for (int64_t& s : sizes) {
    if (s == -1) s = in[axis] - known;
  }
  return sizes;
}

int stack_axis(const Attrs& attrs, int ndim) { return norm_axis(attrs.get_int("axis", 0), ndim + 1, "stack", "axis"); }

Tensor stack(std::span<const Tensor> xs, int axis) {
  SW_CHECK(!xs.empty(), "stack: needs at least one input");
  Shape one;  // x with the new extent-1 dim
  for (int d = 0; d <= xs[0].ndim(); ++d) one.push_back(d == axis ? 1 : xs[0].shape()[d < axis ? d : d - 1]);
  std::vector<Tensor> parts;
  parts.reserve(xs.size());
  for (size_t k = 0; k < xs.size(); ++k) {
    SW_CHECK(xs[k].shape() == xs[0].shape() && xs[k].dtype() == xs[0].dtype(),
             "stack: input {} is {} {} but input 0 is {} {}; all inputs need the same shape and dtype", k,
             dtype_name(xs[k].dtype()), xs[k].shape().to_string(), dtype_name(xs[0].dtype()),
             xs[0].shape().to_string());
    parts.push_back(xs[k].reshaped(one));
  }
  return concat(parts, axis);
}

std::vector<Tensor> unstack(const Tensor& x, int axis) {
  Shape piece;
  for (int d = 0; d < x.ndim(); ++d) {
    if (d != axis) piece.push_back(x.shape()[d]);
  }
  std::vector<int64_t> ones(static_cast<size_t>(x.shape()[axis]), 1);
  std::vector<Tensor> out = split(x, axis, ones);
  for (Tensor& t : out) t = t.reshaped(piece);
  return out;
}

// ---------------------------------------------------------------- slice

SliceBounds slice_bounds(const Shape& in, const Attrs& attrs) {
  int64_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  std::span<const int64_t> axes = attr_ints(attrs, "axes", s1, "slice");
  std::span<const int64_t> starts = attr_ints(attrs, "starts", s2, "slice");
  std::span<const int64_t> ends = attr_ints(attrs, "ends", s3, "slice");
  std::span<const int64_t> steps = attr_ints(attrs, "steps", s4, "slice");
  SW_CHECK(starts.size() == axes.size() && ends.size() == axes.size(),
           "slice: axes, starts and ends must have equal lengths, got {}", attrs.to_string());
  SW_CHECK(steps.empty() || steps.size() == axes.size(), "slice: steps must match axes, got {}", attrs.to_string());
  SliceBounds b;
  for (int d = 0; d < in.ndim(); ++d) b.size[static_cast<size_t>(d)] = in[d];
  uint32_t seen = 0;
  for (size_t k = 0; k < axes.size(); ++k) {
    SW_CHECK(steps.empty() || steps[k] == 1, "slice: only step 1 is supported, got {}", attrs.to_string());
    int d = norm_axis(axes[k], in.ndim(), "slice", "axis");
    SW_CHECK(!(seen & (1u << d)), "slice: axis {} is listed twice in {}", d, attrs.to_string());
    seen |= 1u << d;
    const int64_t n = in[d];
    auto clamp = [n](int64_t v) {
      if (v < 0) v = v < -n ? 0 : v + n;
      return v > n ? n : v;
    };
    int64_t start = clamp(starts[k]), end = clamp(ends[k]);
    auto u = static_cast<size_t>(d);
    b.start[u] = start;
    b.size[u] = end > start ? end - start : 0;
    if (b.start[u] != 0 || b.size[u] != n) b.sliced |= 1u << d;
  }
  for (int d = 0; d < in.ndim(); ++d) b.out.push_back(b.size[static_cast<size_t>(d)]);
  return b;
}

Tensor slice_local(const Tensor& x, const Shape& global_in, const Attrs& attrs) {
  const SliceBounds b = slice_bounds(global_in, attrs);
  SW_CHECK(x.ndim() == global_in.ndim(), "slice: a local input {} for a global input {}", x.shape().to_string(),
           global_in.to_string());
  std::array<int64_t, kMaxDims> off{};
  Shape sizes = x.shape();
  for (int d = 0; d < x.ndim(); ++d) {
    if (!((b.sliced >> d) & 1u)) continue;
    SW_CHECK(x.shape()[d] == global_in[d],
             "slice: dim {} of {} is cut but its shard has extent {}; it must be "
             "Replicate",
             d, global_in.to_string(), x.shape()[d]);
    off[static_cast<size_t>(d)] = b.start[static_cast<size_t>(d)];
    sizes[d] = b.size[static_cast<size_t>(d)];
  }
  return x.slice({off.data(), sizes.size()}, sizes);
}

Tensor slice_backward_local(const Tensor& dout, const Shape& global_in, const Attrs& attrs) {
  const SliceBounds b = slice_bounds(global_in, attrs);
  SW_CHECK(dout.ndim() == global_in.ndim(), "slice backward: dout {} for an input {}", dout.shape().to_string(),
           global_in.to_string());
  Shape dx = dout.shape();
  std::array<int64_t, kMaxDims> off{};
  for (int d = 0; d < dx.ndim(); ++d) {
    if (!((b.sliced >> d) & 1u)) continue;
    SW_CHECK(dout.shape()[d] == b.size[static_cast<size_t>(d)],
             "slice backward: dim {} is cut but dout's shard has extent {} of {}; it must be Replicate", d,
             dout.shape()[d], b.size[static_cast<size_t>(d)]);
    dx[d] = global_in[d];
    off[static_cast<size_t>(d)] = b.start[static_cast<size_t>(d)];
  }
  Tensor out(dout.dtype(), dx);
  out.paste(dout, {off.data(), dx.size()});
  return out;
}

// ---------------------------------------------------------------- tile

TileSpec tile_spec(const Shape& in, const Attrs& attrs) {
  int64_t scratch = 0;
  std::span<const int64_t> reps = attr_ints(attrs, "repeat_times", scratch, "tile");
  SW_CHECK(attrs.has("repeat_times"), "tile: the attribute 'repeat_times' is required");
  TileSpec t;
  t.ndim = std::max(in.ndim(), static_cast<int>(reps.size()));
  SW_CHECK(t.ndim <= kMaxDims, "tile: repeat_times {} gives more than {} dims", attrs.to_string(), kMaxDims);
  t.lead = t.ndim - in.ndim();
  const int pad = t.ndim - static_cast<int>(reps.size());
  for (int j = 0; j < t.ndim; ++j) {
    int64_t r = j < pad ? 1 : reps[static_cast<size_t>(j - pad)];
    SW_CHECK(r >= 0, "tile: repeat_times {} has a negative entry {}", attrs.to_string(), r);
    t.reps[static_cast<size_t>(j)] = r;
    t.out.push_back((j < t.lead ? 1 : in[j - t.lead]) * r);
  }
  return t;
}

namespace {
// x's local extents aligned with the output (leading 1s).
Shape promote(const Shape& x, int lead) {
  Shape s;
  for (int j = 0; j < lead; ++j) s.push_back(1);
  for (int64_t e : x) s.push_back(e);
  return s;
}
}  // namespace

Tensor tile_local(const Tensor& x, const Shape& global_in, const Attrs& attrs) {
  const TileSpec t = tile_spec(global_in, attrs);
  const Shape src = promote(x.shape(), t.lead);
  Shape out = src;
  for (int j = t.lead; j < t.ndim; ++j) {
    if (t.reps[static_cast<size_t>(j)] == 1) continue;
    SW_CHECK(src[j] == global_in[j - t.lead],
             "tile: dim {} of {} is repeated but its shard has extent {}; it must be "
             "Replicate",
             j - t.lead, global_in.to_string(), src[j]);
  }
  for (int j = 0; j < t.ndim; ++j) out[j] = src[j] * t.reps[static_cast<size_t>(j)];
  Tensor result(x.dtype(), out);
  SW_DISPATCH(x.dtype(), [&] {
    const T* s = x.data<T>();
    T* dst = result.data<T>();
    modulo_walk(out, src, [&](int64_t o, int64_t i) { dst[o] = s[i]; });
  });
  return result;
}

namespace {
// out[i] = sum of dout's elements that modulo_walk maps to i (`src` = out aligned with dout).
template <class T>
void sum_tiles(const Tensor& dout, const Shape& src, Tensor& out) {
  if constexpr (std::is_same_v<T, bool>) {
    fail("tile backward: bool tensors have no gradient");
  } else {
    using Acc = std::conditional_t<is_float_v<T>, double, compute_t<T>>;
    std::vector<Acc> acc(static_cast<size_t>(out.numel()), Acc{});
    const T* g = dout.data<T>();
    modulo_walk(dout.shape(), src, [&](int64_t o, int64_t i) {
      acc[static_cast<size_t>(i)] += static_cast<Acc>(static_cast<compute_t<T>>(g[o]));
    });
    T* dst = out.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) dst[i] = static_cast<T>(static_cast<compute_t<T>>(acc[i]));
  }
}
}  // namespace

Tensor tile_backward_local(const Tensor& dout, const Shape& global_in, const Attrs& attrs) {
  const TileSpec t = tile_spec(global_in, attrs);
  SW_CHECK(dout.ndim() == t.ndim, "tile backward: dout {} for an output {}", dout.shape().to_string(),
           t.out.to_string());
  Shape dx;   // local gradient of x
  Shape src;  // dx aligned with dout (leading 1s)
  for (int j = 0; j < t.ndim; ++j) {
    const int64_t r = t.reps[static_cast<size_t>(j)];
    int64_t e = 1;
    if (j >= t.lead) {
      e = r == 1 ? dout.shape()[j] : global_in[j - t.lead];
      SW_CHECK(r == 1 || e == 1 || dout.shape()[j] == t.out[j],
               "tile backward: dim {} is repeated but dout's shard has extent {} of {}; it must be Replicate", j,
               dout.shape()[j], t.out[j]);
      dx.push_back(e);
    }
    src.push_back(e);
  }
  Tensor out(dout.dtype(), dx);
  SW_DISPATCH(dout.dtype(), [&] { sum_tiles<T>(dout, src, out); });
  return out;
}

}  // namespace shardwise::ops
