#include "shardwise/verify/sim_mesh.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "shardwise/mesh/shard_math.h"

namespace shardwise::verify {

using mesh::DistAttr;
using mesh::ProcessMesh;
using mesh::ReduceOp;

Tensor random_tensor(const Shape& shape, DType dtype, const ops::ValueGen& gen, const Philox& rng) {
  Tensor t(dtype, shape);
  double lo = gen.lo, hi = gen.hi;
  if (dtype == DType::U8) lo = std::max(lo, 0.0);
  bool integer_values = gen.kind != ops::ValueGen::Kind::Uniform || !is_floating(dtype);
  SW_DISPATCH(dtype, [&] {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      double u = rng.uniform_f64(static_cast<uint64_t>(i));
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = u < 0.5;
      } else if (integer_values) {
        double v = std::floor(lo + u * (std::floor(hi) - std::ceil(lo) + 1.0));
        p[i] = static_cast<T>(static_cast<compute_t<T>>(std::min(v, hi)));
      } else {
        p[i] = static_cast<T>(static_cast<compute_t<T>>(lo + u * (hi - lo)));
      }
    }
  });
  return t;
}

namespace {

// Splits `v` into `k` parts that reduce (by `op`) to v. Element i of part j draws from `rng`.
template <class T>
std::vector<Tensor> split_value(const Tensor& v, ReduceOp op, int64_t k, const Philox& rng) {
  using C = compute_t<T>;
  std::vector<Tensor> parts;
  for (int64_t j = 0; j < k; ++j) parts.emplace_back(v.dtype(), v.shape());
  const T* src = v.data<T>();
  int64_t n = v.numel();
  auto draw = [&](int64_t i, int64_t j) { return rng.uniform_f64(static_cast<uint64_t>(i * (k + 1) + j)); };
  for (int64_t i = 0; i < n; ++i) {
    C value = static_cast<C>(src[i]);
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
      C target = op == ReduceOp::Sum ? value : static_cast<C>(value * static_cast<C>(k));
      C rest = target;
      for (int64_t j = 0; j + 1 < k; ++j) {
        C part;
        if constexpr (std::is_floating_point_v<C>) {
          part = static_cast<C>((draw(i, j) * 2.0 - 1.0) * (1.0 + std::fabs(static_cast<double>(value))));
        } else if constexpr (std::is_same_v<C, bool>) {
          part = false;
        } else {
          part = static_cast<C>(static_cast<int64_t>(draw(i, j) * 7.0) - 3);
        }
        parts[static_cast<size_t>(j)].data<T>()[i] = static_cast<T>(part);
        rest = static_cast<C>(rest - part);
      }
      parts[static_cast<size_t>(k - 1)].data<T>()[i] = static_cast<T>(rest);
    } else {
      // One rank (chosen per element) holds the value; the others hold values on the far side.
      auto holder = static_cast<int64_t>(draw(i, k) * static_cast<double>(k)) % k;
      bool is_max = op == ReduceOp::Max;
      for (int64_t j = 0; j < k; ++j) {
        C part = value;
        if (j != holder) {
          double gap = draw(i, j);
          if constexpr (std::is_same_v<C, bool>) {
            part = is_max ? (value && gap < 0.5) : (value || gap < 0.5);
          } else if constexpr (std::is_floating_point_v<C>) {
            if (!std::isnan(value)) {
              C delta = static_cast<C>(gap * (1.0 + std::fabs(static_cast<double>(value))));
              part = is_max ? static_cast<C>(value - delta) : static_cast<C>(value + delta);
            }
          } else {
            auto delta = static_cast<int64_t>(gap * 4.0);
            auto lo = static_cast<int64_t>(std::numeric_limits<C>::lowest());
            auto hi = static_cast<int64_t>(std::numeric_limits<C>::max());
            int64_t p = is_max ? std::max(lo, static_cast<int64_t>(value) - delta)
                               : std::min(hi, static_cast<int64_t>(value) + delta);
            part = static_cast<C>(p);
          }
        }
        parts[static_cast<size_t>(j)].data<T>()[i] = static_cast<T>(part);
      }
    }
  }
  return parts;
}

// Ranks that differ from `rank` only in mesh dim `m`, ordered by their coordinate on m.
std::vector<int64_t> line_through(const ProcessMesh& mesh, int64_t rank, int m) {
  std::vector<int64_t> c = mesh.coords(rank);
  std::vector<int64_t> out;
  for (int64_t j = 0; j < mesh.dim_size(m); ++j) {
    c[static_cast<size_t>(m)] = j;
    out.push_back(mesh.rank_index(c));
  }
  return out;
}

template <class T>
void reduce_into(Tensor& acc, const Tensor& other, ReduceOp op) {
  using C = compute_t<T>;
  T* a = acc.data<T>();
  const T* b = other.data<T>();
  for (int64_t i = 0; i < acc.numel(); ++i) {
    C x = static_cast<C>(a[i]), y = static_cast<C>(b[i]);
    C r;
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
      if constexpr (std::is_same_v<C, bool>) {
        r = x || y;
      } else {
        r = static_cast<C>(x + y);
      }
    } else {
      bool take_y;
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(x) || std::isnan(y)) {
          a[i] = static_cast<T>(std::numeric_limits<C>::quiet_NaN());
          continue;
        }
      }
      take_y = op == ReduceOp::Max ? (y > x) : (y < x);
      r = take_y ? y : x;
    }
    a[i] = static_cast<T>(r);
  }
}

template <class T>
void divide_by(Tensor& acc, int64_t k) {
  if constexpr (!std::is_same_v<T, bool>) {
    using C = compute_t<T>;
    T* a = acc.data<T>();
    for (int64_t i = 0; i < acc.numel(); ++i) a[i] = static_cast<T>(static_cast<C>(a[i]) / static_cast<C>(k));
  }
}

}  // namespace

std::vector<Tensor> distribute(const Tensor& global, const DistAttr& dist, const ProcessMesh& mesh, const Philox& rng) {
  dist.validate(global.ndim(), mesh.ndim());
  auto n = static_cast<size_t>(mesh.size());
  std::vector<Tensor> values(n, global);
  // Split along each Partial mesh dim in order; within a line along m every rank holds the same
  // value so far (earlier splits were along other dims), and that value is split into parts.
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (!dist[m].is_partial()) continue;
    std::vector<bool> done(n, false);
    for (int64_t r = 0; r < mesh.size(); ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      std::vector<int64_t> line = line_through(mesh, r, m);
      // Key the split by the coordinates on the other Partial dims only: lines that differ just
      // in Replicate (or Shard) coordinates must split identically, so replicas stay identical.
      uint64_t key = 0;
      std::vector<int64_t> c = mesh.coords(r);
      for (int o = 0; o < mesh.ndim(); ++o) {
        if (o != m && dist[o].is_partial()) key = key * 131 + static_cast<uint64_t>(c[static_cast<size_t>(o)]) + 1;
      }
      Philox line_rng(rng.seed() ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(m + 1)),
                      rng.stream() * 1000003ull + key);
      std::vector<Tensor> parts = SW_DISPATCH(global.dtype(), [&] {
        return split_value<T>(values[static_cast<size_t>(line[0])], dist[m].reduce, mesh.dim_size(m), line_rng);
      });
      for (size_t j = 0; j < line.size(); ++j) {
        values[static_cast<size_t>(line[j])] = parts[j];
        done[static_cast<size_t>(line[j])] = true;
      }
    }
  }
  std::vector<Tensor> locals(n);
  for (int64_t r = 0; r < mesh.size(); ++r) {
    mesh::LocalBlock block = mesh::local_block(global.shape(), dist, mesh, mesh.coords(r));
    locals[static_cast<size_t>(r)] = values[static_cast<size_t>(r)].slice(block.offsets(), block.shape);
  }
  return locals;
}

Tensor assemble(const std::vector<Tensor>& locals, const Shape& global_shape, DType dtype, const DistAttr& dist,
                const ProcessMesh& mesh, std::string& error) {
  error.clear();
  if (static_cast<int64_t>(locals.size()) != mesh.size()) {
    error = fmt::format("{} local tensors for a mesh of {} ranks", locals.size(), mesh.size());
    return {};
  }
  std::vector<mesh::LocalBlock> blocks;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    blocks.push_back(mesh::local_block(global_shape, dist, mesh, mesh.coords(r)));
    const Tensor& t = locals[static_cast<size_t>(r)];
    if (!t.defined() || t.dtype() != dtype || !(t.shape() == blocks.back().shape)) {
      error = fmt::format("rank {} holds {} {} but the claimed placements {} give it {} {}", r,
                          t.defined() ? dtype_name(t.dtype()) : "nothing", t.defined() ? t.shape().to_string() : "",
                          dist.to_string(), dtype_name(dtype), blocks.back().shape.to_string());
      return {};
    }
  }
  std::vector<Tensor> values(locals.size());
  for (size_t r = 0; r < locals.size(); ++r) values[r] = locals[r].clone();
  // Reduce Partial mesh dims, the last one first; afterwards coordinate 0 on each holds the sum.
  for (int m = mesh.ndim() - 1; m >= 0; --m) {
    if (!dist[m].is_partial()) continue;
    for (int64_t r = 0; r < mesh.size(); ++r) {
      if (mesh.coords(r)[static_cast<size_t>(m)] != 0) continue;
      std::vector<int64_t> line = line_through(mesh, r, m);
      SW_DISPATCH(dtype, [&] {
        for (size_t j = 1; j < line.size(); ++j) {
          reduce_into<T>(values[static_cast<size_t>(r)], values[static_cast<size_t>(line[j])], dist[m].reduce);
        }
        if (dist[m].reduce == ReduceOp::Avg) divide_by<T>(values[static_cast<size_t>(r)], mesh.dim_size(m));
      });
    }
  }
  Tensor global(dtype, global_shape);
  for (int64_t r = 0; r < mesh.size(); ++r) {
    std::vector<int64_t> c = mesh.coords(r);
    bool representative = true, pastes = true;
    for (int m = 0; m < mesh.ndim(); ++m) {
      if (dist[m].is_partial() && c[static_cast<size_t>(m)] != 0) representative = false;
      if (dist[m].is_replicate() && c[static_cast<size_t>(m)] != 0) pastes = false;
    }
    if (!representative) continue;
    if (!pastes) {
      // A replica: must equal the copy at coordinate 0 of every Replicate mesh dim, bit for bit.
      std::vector<int64_t> c0 = c;
      for (int m = 0; m < mesh.ndim(); ++m) {
        if (dist[m].is_replicate()) c0[static_cast<size_t>(m)] = 0;
      }
      const Tensor& a = values[static_cast<size_t>(r)];
      const Tensor& b = values[static_cast<size_t>(mesh.rank_index(c0))];
      if (std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0) {
        CompareResult diff = compare(a, b);
        error = fmt::format("placements {} claim ranks {} and {} hold replicas, but they differ: {}", dist.to_string(),
                            r, mesh.rank_index(c0), diff.message);
        return {};
      }
      continue;
    }
    global.paste(values[static_cast<size_t>(r)], blocks[static_cast<size_t>(r)].offsets());
  }
  return global;
}

}  // namespace shardwise::verify
