#include "shardwise/ops/attention/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"
#include "shardwise/tensor/fast_math.h"
#include "shardwise/tensor/gemm.h"
#include "shardwise/tensor/parallel.h"

namespace shardwise::ops {

namespace {

constexpr int64_t kTile = 64;  // query rows and keys per tile: a [64, 64] score tile at a time

// S: the local query rows; T: the keys (the whole sequence, or S on one device).
struct Dims {
  int64_t B = 0, G = 0, R = 1, S = 0, D = 0, T = 0;
};
Dims dims_of(const Shape& q, const Shape& k) {
  if (q.ndim() == 4) return Dims{q[0], q[1], 1, q[2], q[3], k[2]};
  return Dims{q[0], q[1], q[2], q[3], q[4], k[2]};
}

// exp(d) for d = x - max <= 0: fast_expf with 0 below e^-80 in float, as the softmax kernel does
// (ops/softmax/kernels.cc), std::exp in double.
inline float exp_of(float d) { return d < -80.0f ? 0.0f : fast_expf(d); }
inline double exp_of(double d) { return std::exp(d); }

// The kernel's view of one (batch, kv head, query head) block, in the compute type C.
template <class C>
const C* compute_copy(const void* src, DType dtype, int64_t n, std::vector<C>& buf) {
  if (dtype == dtype_v<C>) return static_cast<const C*>(src);
  buf.resize(static_cast<size_t>(n));
  SW_DISPATCH(dtype, [&] {
    if constexpr (is_float_v<T>) {
      const T* s = static_cast<const T*>(src);
      for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = static_cast<C>(s[i]);
    }
  });
  return buf.data();
}

template <class C>
void gemm_rows(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const C* a, int64_t lda, const C* b, int64_t ldb,
               C* c, int64_t ldc, double beta) {
  GemmArgs g = gemm_args(ta, tb, m, n, k, beta);
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  gemm<C>(g, a, b, c);
}

// Visibility and dropout of local query row i and local key j of one query head: query row i is
// the sequence's token query0 + i, key j its token key0 + j; each token's position in the original
// sequence (the identity, or cp's balanced order) is qpos[i] / kpos[j], which the causal mask and
// the dropout key compare; the document ids qdoc / kdoc are the rows' and keys' own.
struct TileKeys {
  const int64_t *qdoc = nullptr, *kdoc = nullptr;  // document ids, or null
  const Philox* rng = nullptr;                     // null: no dropout
  const int64_t *qpos = nullptr, *kpos = nullptr;
  double p = 0.0;
  uint64_t head_base = 0;  // (b NH + h) seq: the global row index of position 0
  int64_t seq = 0;         // the whole sequence's length
  bool visible(int64_t i, int64_t j) const {
    return kpos[j] <= qpos[i] && (qdoc == nullptr || kdoc[j] == qdoc[i]);
  }
  bool keep(int64_t i, int64_t j) const {
    const auto row = head_base + static_cast<uint64_t>(qpos[i]);
    return static_cast<double>(rng->uniform(row * static_cast<uint64_t>(seq) + static_cast<uint64_t>(kpos[j]))) >= p;
  }
  // Whether any key of [j0, j0 + nj) may be visible to a row of [i0, i0 + ni), and whether some
  // key there may be masked for one of them (so the tile needs the per-element mask).
  struct Span {
    int64_t lo, hi;
  };
  static Span range(const int64_t* pos, int64_t x0, int64_t n) {
    Span s{pos[x0], pos[x0]};
    for (int64_t x = x0; x < x0 + n; ++x) s.lo = std::min(s.lo, pos[x]), s.hi = std::max(s.hi, pos[x]);
    return s;
  }
  bool any_visible(int64_t i0, int64_t ni, int64_t j0, int64_t nj) const {
    return range(kpos, j0, nj).lo <= range(qpos, i0, ni).hi;
  }
  bool edge(int64_t i0, int64_t ni, int64_t j0, int64_t nj) const {
    return qdoc != nullptr || range(kpos, j0, nj).hi > range(qpos, i0, ni).lo;
  }
};

struct Plan {
  Dims d;
  AttentionArgs args;
  AttentionCoords at;
  int64_t heads_global = 0;  // NH
  int64_t R_global = 0;
  int64_t seq = 0;                  // the whole sequence's length
  std::vector<int64_t> qpos, kpos;  // [S], [T]: the local rows' and keys' original positions
};
Plan plan_of(const Shape& q, const Shape& k, const AttentionArgs& args, const AttentionCoords& coords) {
  Plan p{dims_of(q, k), args, coords, 0, 0, 0, {}, {}};
  const int64_t G = coords.groups < 0 ? p.d.G : coords.groups;
  p.R_global = coords.reps < 0 ? p.d.R : coords.reps;
  p.heads_global = G * p.R_global;
  p.seq = coords.seq < 0 ? p.d.T : coords.seq;
  SW_CHECK(coords.query0 >= 0 && coords.query0 + p.d.S <= p.seq && coords.key0 >= 0 && coords.key0 + p.d.T <= p.seq,
           "flash_attention: the local queries [{}, {}) and keys [{}, {}) do not lie in the sequence of {}",
           coords.query0, coords.query0 + p.d.S, coords.key0, coords.key0 + p.d.T, p.seq);
  for (int64_t i = 0; i < p.d.S; ++i) p.qpos.push_back(mesh::cp_balanced_position(coords.query0 + i, p.seq, args.balanced_ranks));
  for (int64_t j = 0; j < p.d.T; ++j) p.kpos.push_back(mesh::cp_balanced_position(coords.key0 + j, p.seq, args.balanced_ranks));
  return p;
}
TileKeys tile_keys(const Plan& pl, const Philox& rng, const int64_t* doc, int64_t b, int64_t g, int64_t r) {
  TileKeys t;
  if (doc != nullptr) t.qdoc = doc + b * pl.seq + pl.at.query0, t.kdoc = doc + b * pl.seq + pl.at.key0;
  t.rng = pl.args.dropout() ? &rng : nullptr;
  t.qpos = pl.qpos.data();
  t.kpos = pl.kpos.data();
  t.p = pl.args.p;
  t.seq = pl.seq;
  const int64_t h = (pl.at.group0 + g) * pl.R_global + pl.at.rep0 + r;
  t.head_base = static_cast<uint64_t>((pl.at.batch0 + b) * pl.heads_global + h) * static_cast<uint64_t>(pl.seq);
  return t;
}

// One query head's forward: out rows [S, D] (C), lse [S] from Qs [S, D] (q scaled), K, V [T, D].
template <class C>
void forward_head(const C* Qs, const C* K, const C* V, const TileKeys& keys, int64_t S, int64_t T, int64_t D,
                  C keep_scale, C* out, C* lse) {
  std::vector<C> s(static_cast<size_t>(kTile * kTile)), acc(static_cast<size_t>(kTile * D));
  std::vector<double> m(kTile), l(kTile);
  const C neg_inf = -std::numeric_limits<C>::infinity();
  for (int64_t i0 = 0; i0 < S; i0 += kTile) {
    const int64_t ni = std::min(kTile, S - i0);
    std::fill(acc.begin(), acc.end(), C(0));
    std::fill(m.begin(), m.end(), -std::numeric_limits<double>::infinity());
    std::fill(l.begin(), l.end(), 0.0);
    for (int64_t j0 = 0; j0 < T; j0 += kTile) {
      const int64_t nj = std::min(kTile, T - j0);
      if (!keys.any_visible(i0, ni, j0, nj)) continue;
      gemm_rows<C>(false, true, ni, nj, D, Qs + i0 * D, D, K + j0 * D, D, s.data(), nj, 0.0);
      const bool edge = keys.edge(i0, ni, j0, nj);  // some key of the tile may be invisible
      for (int64_t a = 0; a < ni; ++a) {
        const int64_t i = i0 + a;
        C* row = s.data() + a * nj;
        if (edge)
          for (int64_t c = 0; c < nj; ++c)
            if (!keys.visible(i, j0 + c)) row[c] = neg_inf;
        C mx = neg_inf;
        for (int64_t c = 0; c < nj; ++c) mx = std::max(mx, row[c]);
        const double mnew = std::max(m[static_cast<size_t>(a)], static_cast<double>(mx));
        if (std::isinf(mnew)) {  // nothing visible yet in this row (a later document)
          std::fill(row, row + nj, C(0));
          continue;
        }
        const C alpha = exp_of(static_cast<C>(m[static_cast<size_t>(a)] - mnew)), mn = static_cast<C>(mnew);
        for (int64_t c = 0; c < nj; ++c) row[c] = exp_of(row[c] - mn);  // masked: exp(-inf) = 0
        double sum = 0.0;
        for (int64_t c = 0; c < nj; ++c) sum += static_cast<double>(row[c]);
        if (keys.rng != nullptr)
          for (int64_t c = 0; c < nj; ++c) row[c] = keys.keep(i, j0 + c) ? row[c] * keep_scale : C(0);
        l[static_cast<size_t>(a)] = l[static_cast<size_t>(a)] * static_cast<double>(alpha) + sum;
        m[static_cast<size_t>(a)] = mnew;
        C* arow = acc.data() + a * D;
        if (alpha != C(1)) for (int64_t d = 0; d < D; ++d) arow[d] *= alpha;
      }
      gemm_rows<C>(false, false, ni, D, nj, s.data(), nj, V + j0 * D, D, acc.data(), D, 1.0);
    }
    for (int64_t a = 0; a < ni; ++a) {
      const double la = l[static_cast<size_t>(a)];
      const C inv = static_cast<C>(la > 0 ? 1.0 / la : 0.0);  // no visible key (a ring's block): out 0
      for (int64_t d = 0; d < D; ++d) out[(i0 + a) * D + d] = acc[static_cast<size_t>(a * D + d)] * inv;
      lse[i0 + a] = la > 0 ? static_cast<C>(m[static_cast<size_t>(a)] + std::log(la)) : neg_inf;
    }
  }
}

// One query head's backward: adds dK, dV [T, D] and writes dQs [S, D] (the gradient of q scaled).
template <class C>
void backward_head(const C* Qs, const C* K, const C* V, const C* dO, const C* lse, const C* delta,
                   const TileKeys& keys, int64_t S, int64_t T, int64_t D, C keep_scale, C* dQs, C* dK, C* dV) {
  const size_t tile = static_cast<size_t>(kTile * kTile);
  std::vector<C> P(tile), Pd(tile), dP(tile);
  std::fill(dQs, dQs + S * D, C(0));
  for (int64_t i0 = 0; i0 < S; i0 += kTile) {
    const int64_t ni = std::min(kTile, S - i0);
    for (int64_t j0 = 0; j0 < T; j0 += kTile) {
      const int64_t nj = std::min(kTile, T - j0);
      if (!keys.any_visible(i0, ni, j0, nj)) continue;
      gemm_rows<C>(false, true, ni, nj, D, Qs + i0 * D, D, K + j0 * D, D, P.data(), nj, 0.0);
      gemm_rows<C>(false, true, ni, nj, D, dO + i0 * D, D, V + j0 * D, D, dP.data(), nj, 0.0);
      const bool edge = keys.edge(i0, ni, j0, nj);  // some key of the tile may be invisible
      for (int64_t a = 0; a < ni; ++a) {
        const int64_t i = i0 + a;
        C *p = P.data() + a * nj, *pd = Pd.data() + a * nj, *ds = dP.data() + a * nj;
        const C l = lse[i], dl = delta[i];
        for (int64_t c = 0; c < nj; ++c) p[c] = exp_of(p[c] - l);
        if (edge)
          for (int64_t c = 0; c < nj; ++c)
            if (!keys.visible(i, j0 + c)) p[c] = C(0);
        if (keys.rng == nullptr) {
          for (int64_t c = 0; c < nj; ++c) ds[c] = p[c] * (ds[c] - dl);  // dS
        } else {
          for (int64_t c = 0; c < nj; ++c) {
            const C k = keys.keep(i, j0 + c) ? keep_scale : C(0);
            pd[c] = p[c] * k;
            ds[c] = p[c] * (ds[c] * k - dl);
          }
        }
      }
      const C* dropped = keys.rng == nullptr ? P.data() : Pd.data();
      gemm_rows<C>(true, false, nj, D, ni, dropped, nj, dO + i0 * D, D, dV + j0 * D, D, 1.0);
      gemm_rows<C>(false, false, ni, D, nj, dP.data(), nj, K + j0 * D, D, dQs + i0 * D, D, 1.0);
      gemm_rows<C>(true, false, nj, D, ni, dP.data(), nj, Qs + i0 * D, D, dK + j0 * D, D, 1.0);
    }
  }
}

template <class C>
void store(const C* src, void* dst, DType dtype, int64_t n, int64_t offset, C factor = C(1)) {
  SW_DISPATCH(dtype, [&] {
    if constexpr (is_float_v<T>) {
      T* d = static_cast<T*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(src[i] * factor);
    }
  });
}

const int64_t* doc_data(const Tensor& doc) { return doc.defined() ? doc.data<int64_t>() : nullptr; }

template <class C>
AttentionOutputs forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                               const Plan& pl) {
  const Dims d = pl.d;
  const DType dt = q.dtype();
  AttentionOutputs r{Tensor::uninitialized(dt, q.shape()), Tensor::uninitialized(dtype_v<C>, attention_lse_shape(q.shape()))};
  const Philox rng(pl.args.seed, pl.args.stream);
  const int64_t SD = d.S * d.D, TD = d.T * d.D, es = static_cast<int64_t>(dtype_size(dt));
  const C scale = static_cast<C>(pl.args.scale);
  const C keep_scale = static_cast<C>(pl.args.dropout() ? 1.0 / (1.0 - pl.args.p) : 1.0);
  // The outer loop over (batch, kv head) blocks, spread over the rank's threads: each block writes
  // its own rows of out and lse, so the result does not depend on the thread count.
  parallel_for(d.B * d.G, 1, [&](int64_t bg0, int64_t bg1) {
    std::vector<C> kb, vb, qb, qs(static_cast<size_t>(SD)), ob(static_cast<size_t>(SD));
    for (int64_t bg = bg0; bg < bg1; ++bg) {
      const int64_t b = bg / d.G, g = bg % d.G;
      const C* K = compute_copy<C>(k.raw() + bg * TD * es, dt, TD, kb);
      const C* V = compute_copy<C>(v.raw() + bg * TD * es, dt, TD, vb);
      for (int64_t r0 = 0; r0 < d.R; ++r0) {
        const int64_t head = bg * d.R + r0;
        const C* Q = compute_copy<C>(q.raw() + head * SD * es, dt, SD, qb);
        for (int64_t e = 0; e < SD; ++e) qs[static_cast<size_t>(e)] = Q[e] * scale;
        forward_head<C>(qs.data(), K, V, tile_keys(pl, rng, doc_data(doc), b, g, r0), d.S, d.T, d.D, keep_scale,
                        ob.data(), r.lse.data<C>() + head * d.S);
        store<C>(ob.data(), r.out.raw(), dt, SD, head * SD);
      }
    }
  });
  return r;
}

template <class C>
AttentionGrads backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, const Plan& pl) {
  const Dims d = pl.d;
  const DType dt = q.dtype();
  AttentionGrads r{Tensor::uninitialized(dt, q.shape()), Tensor::uninitialized(dt, k.shape()),
                   Tensor::uninitialized(dt, v.shape())};
  const Philox rng(pl.args.seed, pl.args.stream);
  const int64_t SD = d.S * d.D, TD = d.T * d.D, es = static_cast<int64_t>(dtype_size(dt));
  const C scale = static_cast<C>(pl.args.scale);
  const C keep_scale = static_cast<C>(pl.args.dropout() ? 1.0 / (1.0 - pl.args.p) : 1.0);
  const size_t n = static_cast<size_t>(SD), nk = static_cast<size_t>(TD);
  // Where the gradients' dtype is the compute type (f32, f64), dq, dk and dv are summed straight
  // into the outputs (each thread's blocks are its own): a thread's scratch is then q·scale and
  // delta alone, not 4 [S, D] buffers (8 MiB a thread at 8 K tokens, D = 64), with the same
  // arithmetic in the same order.
  const bool direct = dt == dtype_v<C>;
  // (batch, kv head) blocks over the rank's threads: each writes its own dq heads, dk and dv.
  parallel_for(d.B * d.G, 1, [&](int64_t bg0, int64_t bg1) {
    std::vector<C> kb, vb, qb, ob, gb, qs(n), dqs(direct ? 0 : n), dk(direct ? 0 : nk), dv(direct ? 0 : nk),
        delta(static_cast<size_t>(d.S));
    for (int64_t bg = bg0; bg < bg1; ++bg) {
      const int64_t b = bg / d.G, g = bg % d.G;
      const C* K = compute_copy<C>(k.raw() + bg * TD * es, dt, TD, kb);
      const C* V = compute_copy<C>(v.raw() + bg * TD * es, dt, TD, vb);
      C* dK = direct ? static_cast<C*>(static_cast<void*>(r.dk.raw())) + bg * TD : dk.data();
      C* dV = direct ? static_cast<C*>(static_cast<void*>(r.dv.raw())) + bg * TD : dv.data();
      std::fill(dK, dK + TD, C(0));
      std::fill(dV, dV + TD, C(0));
      for (int64_t r0 = 0; r0 < d.R; ++r0) {
        const int64_t head = bg * d.R + r0;
        const C* Q = compute_copy<C>(q.raw() + head * SD * es, dt, SD, qb);
        const C* O = compute_copy<C>(out.raw() + head * SD * es, dt, SD, ob);
        const C* dO = compute_copy<C>(dout.raw() + head * SD * es, dt, SD, gb);
        for (int64_t e = 0; e < SD; ++e) qs[static_cast<size_t>(e)] = Q[e] * scale;
        for (int64_t i = 0; i < d.S; ++i) {  // delta_i = sum_d dO[i, d] O[i, d]
          double acc = 0.0;
          for (int64_t c = 0; c < d.D; ++c) acc += static_cast<double>(dO[i * d.D + c]) * static_cast<double>(O[i * d.D + c]);
          delta[static_cast<size_t>(i)] = static_cast<C>(acc);
        }
        C* dQ = direct ? static_cast<C*>(static_cast<void*>(r.dq.raw())) + head * SD : dqs.data();
        backward_head<C>(qs.data(), K, V, dO, lse.data<C>() + head * d.S, delta.data(),
                         tile_keys(pl, rng, doc_data(doc), b, g, r0), d.S, d.T, d.D, keep_scale, dQ, dK, dV);
        if (direct) {
          for (int64_t e = 0; e < SD; ++e) dQ[e] = dQ[e] * scale;
        } else {
          store<C>(dqs.data(), r.dq.raw(), dt, SD, head * SD, scale);
        }
      }
      if (!direct) {
        store<C>(dk.data(), r.dk.raw(), dt, TD, bg * TD);
        store<C>(dv.data(), r.dv.raw(), dt, TD, bg * TD);
      }
    }
  });
  return r;
}

bool is_compute_double(DType dt) { return dt == DType::F64; }

}  // namespace

AttentionArgs attention_args(const Attrs& attrs) {
  AttentionArgs a;
  SW_CHECK(attrs.has("scale"), "flash_attention: attribute 'scale' (a float, 1/sqrt(head dim)) is required, got '{}'",
           attrs.to_string());
  a.scale = attrs.get_float("scale", 0.0);
  SW_CHECK(a.scale > 0 && std::isfinite(a.scale), "flash_attention: scale must be a positive number, got {}", a.scale);
  a.p = attrs.get_float("p", 0.0);
  SW_CHECK(a.p >= 0.0 && a.p < 1.0, "flash_attention: dropout p must be in [0, 1), got {}", a.p);
  a.training = attrs.get_bool("training", true);
  if (a.p > 0.0) {
    SW_CHECK(attrs.has("seed"), "flash_attention: attribute 'seed' (an int) is required with p > 0, got '{}'",
             attrs.to_string());
    a.seed = static_cast<uint64_t>(attrs.get_int("seed"));
  }
  a.stream = static_cast<uint64_t>(attrs.get_int("stream", 0));
  a.balanced_ranks = attrs.get_int("balanced_ranks", 1);
  SW_CHECK(a.balanced_ranks >= 1, "flash_attention: balanced_ranks (cp's load-balanced order) must be >= 1, got {}",
           a.balanced_ranks);
  return a;
}

void check_attention_inputs(const Shape& q, DType q_dtype, const Shape& k, DType k_dtype, const Shape& v,
                            DType v_dtype, const Shape* doc, DType doc_dtype, const AttentionCoords* local) {
  SW_CHECK(q.ndim() == 4 || q.ndim() == 5,
           "flash_attention: q must be [B, H, S, D] or grouped [B, G, R, S, D], got {}", q.to_string());
  SW_CHECK(is_floating(q_dtype), "flash_attention: q holds {} (allowed: f32, f64, f16, bf16)", dtype_name(q_dtype));
  SW_CHECK(k_dtype == q_dtype && v_dtype == q_dtype, "flash_attention: q, k, v must share a dtype, got {}, {}, {}",
           dtype_name(q_dtype), dtype_name(k_dtype), dtype_name(v_dtype));
  // Global shapes: the keys are q's sequence. Local blocks: any block of keys.
  const int64_t T = local != nullptr && k.ndim() == 4 ? k[2] : q[q.ndim() - 2];
  const Dims d = dims_of(q, Shape{0, 0, T, 0});
  const Shape kv{d.B, d.G, d.T, d.D};
  SW_CHECK(k == kv && v == kv, "flash_attention: q {} needs k and v {} (one kv head per {}), got k {} and v {}",
           q.to_string(), kv.to_string(), q.ndim() == 4 ? "query head" : "group", k.to_string(), v.to_string());
  if (doc == nullptr) return;
  const int64_t seq = local != nullptr && local->seq >= 0 ? local->seq : d.T;
  SW_CHECK(*doc == Shape({d.B, seq}), "flash_attention: document ids must be [{}, {}] (batch, sequence), got {}", d.B,
           seq, doc->to_string());
  SW_CHECK(doc_dtype == DType::I64, "flash_attention: document ids hold {} (allowed: i64)", dtype_name(doc_dtype));
}

Shape attention_lse_shape(const Shape& q) {
  Shape s;
  for (int i = 0; i + 1 < q.ndim(); ++i) s.push_back(q[i]);
  return s;
}

DType attention_lse_dtype(DType q) { return is_compute_double(q) ? DType::F64 : DType::F32; }

AttentionOutputs flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                 const AttentionArgs& args, const AttentionCoords& coords) {
  const Shape* ds = doc.defined() ? &doc.shape() : nullptr;
  check_attention_inputs(q.shape(), q.dtype(), k.shape(), k.dtype(), v.shape(), v.dtype(), ds,
                         doc.defined() ? doc.dtype() : DType::I64, &coords);
  const Plan pl = plan_of(q.shape(), k.shape(), args, coords);
  if (is_compute_double(q.dtype())) return forward_typed<double>(q, k, v, doc, pl);
  return forward_typed<float>(q, k, v, doc, pl);
}

AttentionGrads flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc,
                                        const Tensor& out, const Tensor& lse, const Tensor& dout,
                                        const AttentionArgs& args, const AttentionCoords& coords) {
  const Shape* ds = doc.defined() ? &doc.shape() : nullptr;
  check_attention_inputs(q.shape(), q.dtype(), k.shape(), k.dtype(), v.shape(), v.dtype(), ds,
                         doc.defined() ? doc.dtype() : DType::I64, &coords);
  SW_CHECK(out.shape() == q.shape() && dout.shape() == q.shape() && out.dtype() == q.dtype() &&
               dout.dtype() == q.dtype(),
           "flash_attention backward: out {} and dout {} must be q's shape {} and dtype", out.shape().to_string(),
           dout.shape().to_string(), q.shape().to_string());
  SW_CHECK(lse.shape() == attention_lse_shape(q.shape()) && lse.dtype() == attention_lse_dtype(q.dtype()),
           "flash_attention backward: lse {} must be {} {}", lse.shape().to_string(),
           attention_lse_shape(q.shape()).to_string(), dtype_name(attention_lse_dtype(q.dtype())));
  const Plan pl = plan_of(q.shape(), k.shape(), args, coords);
  if (is_compute_double(q.dtype())) return backward_typed<double>(q, k, v, doc, out, lse, dout, pl);
  return backward_typed<float>(q, k, v, doc, out, lse, dout, pl);
}

}  // namespace shardwise::ops
