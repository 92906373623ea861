#include "shardwise/tensor/gemm.h"

#include "shardwise/tensor/gemm_backend.h"
#include "shardwise/tensor/gemm_split_probe.h"
#include "shardwise/tensor/parallel.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

namespace shardwise {

namespace {

// Checks one row stride against the stored matrix's column count.
int64_t resolve_ld(int64_t ld, int64_t cols, const char* name) {
  if (ld == -1) return cols;
  SW_CHECK(ld >= cols, "gemm: {} = {} is below the {} columns of the stored matrix (allowed: >= {}, or -1 "
           "for packed)", name, ld, cols, cols);
  return ld;
}

int64_t resolve_stride(int64_t stride, int64_t rows, int64_t ld, const char* name) {
  if (stride == -1) return rows * ld;
  SW_CHECK(stride >= 0, "gemm: {} = {} is negative (allowed: >= 0, or -1 for packed)", name, stride);
  return stride;
}

// The backends take 32-bit dims (Debian's OpenBLAS and BLIS are built with 32-bit BLAS integers).
bool fits_blas(int64_t v) { return v <= INT_MAX; }

// The element type arithmetic runs in: float for 16-bit floats, uint64 (wrapping) for integers.
template <class T>
using acc_t = std::conditional_t<std::is_integral_v<T>, uint64_t, compute_t<T>>;

template <class T>
acc_t<T> load(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<acc_t<T>>(v);
  }
}

template <class T>
T store(acc_t<T> v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int64_t>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
acc_t<T> scalar_of(double v, const char* name) {
  if constexpr (std::is_integral_v<T>) {
    SW_CHECK(std::trunc(v) == v && std::fabs(v) < 9.2e18, "gemm: {} = {} must be a whole number for {}", name, v,
             dtype_name(dtype_v<T>));
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  } else {
    return static_cast<acc_t<T>>(v);
  }
}

// C = beta * C for every batch item (the k == 0 case: op(A) * op(B) is all zeros).
template <class T>
void scale_c(const GemmArgs& g, T* c) {
  acc_t<T> beta = scalar_of<T>(g.beta, "beta");
  for (int64_t b = 0; b < g.batch; ++b) {
    T* cb = c + b * g.stride_c;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        T& e = cb[i * g.ldc + j];
        e = g.beta == 0 ? T{} : store<T>(static_cast<acc_t<T>>(beta * load(e)));
      }
    }
  }
}

// Reference loops (i, p, j order over a row accumulator), for the types BLAS does not cover.
template <class T>
void naive_gemm(const GemmArgs& g, const T* a, const T* b, T* c) {
  using Acc = acc_t<T>;
  Acc alpha = scalar_of<T>(g.alpha, "alpha");
  Acc beta = scalar_of<T>(g.beta, "beta");
  // a(i, p) = a[i * a_i + p * a_p];  b(p, j) = b[p * b_p + j * b_j]
  int64_t a_i = g.trans_a ? 1 : g.lda, a_p = g.trans_a ? g.lda : 1;
  int64_t b_p = g.trans_b ? 1 : g.ldb, b_j = g.trans_b ? g.ldb : 1;
  std::vector<Acc> row(static_cast<size_t>(g.n));
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const T* ab = a + bi * g.stride_a;
    const T* bb = b + bi * g.stride_b;
    T* cb = c + bi * g.stride_c;
    for (int64_t i = 0; i < g.m; ++i) {
      std::fill(row.begin(), row.end(), Acc{});
      for (int64_t p = 0; p < g.k; ++p) {
        Acc av = load(ab[i * a_i + p * a_p]);
        const T* brow = bb + p * b_p;
        for (int64_t j = 0; j < g.n; ++j) row[static_cast<size_t>(j)] += av * load(brow[j * b_j]);
      }
      T* crow = cb + i * g.ldc;
      for (int64_t j = 0; j < g.n; ++j) {
        Acc v = static_cast<Acc>(alpha * row[static_cast<size_t>(j)]);
        if (g.beta != 0) v = static_cast<Acc>(v + beta * load(crow[j]));
        crow[j] = store<T>(v);
      }
    }
  }
}

// One library call: rows [i0, i1) and columns [j0, j1) of C = op(A) op(B) for one batch item.
template <class T>
void blas_block(const GemmArgs& g, const T* a, const T* b, T* c, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const T* ab = a + (g.trans_a ? i0 : i0 * g.lda);
  const T* bb = b + (g.trans_b ? j0 * g.ldb : j0);
  T* cb = c + i0 * g.ldc + j0;
  auto m = static_cast<int>(i1 - i0), n = static_cast<int>(j1 - j0), k = static_cast<int>(g.k);
  auto lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  if constexpr (std::is_same_v<T, float>) {
    backend_sgemm(g.trans_a, g.trans_b, m, n, k, static_cast<float>(g.alpha), ab, lda, bb, ldb,
                  static_cast<float>(g.beta), cb, ldc);
  } else {
    backend_dgemm(g.trans_a, g.trans_b, m, n, k, g.alpha, ab, lda, bb, ldb, g.beta, cb, ldc);
  }
}

// A GEMM split over the rank's pool (RankThreads: the library runs one thread per call) is cut into
// one block of C per thread, by rows when C has at least as many rows as columns (each piece then
// reads all of op(B) and its own rows of op(A)), else by columns; cuts at multiples of kGemmCut
// (the library kernels' unrolls). Each C element is still one library call's sum over the whole k
// in the library's blocking of k, so the bits do not depend on the cuts (tests/tensor/test_gemm.cc
// checks it on 2-4 threads). Every piece has at least kGemmSplitMacs multiply-adds: smaller calls
// run whole, and no piece reaches OpenBLAS's small-matrix kernels (m n k <= 100^3 on SkylakeX-class
// cores), which sum in another order than the blocked kernels a larger whole call runs on. A
// library whose bits do depend on the cuts (tensor/gemm_split_probe.h) is not split.
constexpr double kGemmSplitMacs = 1 << 21;  // ~20 us of one core's SGEMM; a worker's wake-up is a few us

template <class T>
void blas_gemm(const GemmArgs& g, const T* a, const T* b, T* c) {
  SW_CHECK(fits_blas(g.m) && fits_blas(g.n) && fits_blas(g.k) && fits_blas(g.lda) && fits_blas(g.ldb) &&
               fits_blas(g.ldc),
           "gemm: m={} n={} k={} lda={} ldb={} ldc={} exceed the BLAS integer range", g.m, g.n, g.k, g.lda, g.ldb,
           g.ldc);
  ThreadPool* pool = current_thread_pool();
  // f64 is not split: OpenBLAS's DGEMM gives other bits for some blocks (the f64 GEMMs are tests' references).
  const int64_t threads =
      std::is_same_v<T, float> && pool != nullptr && gemm_split_active() && gemm_split_keeps_bits() ? pool->threads() : 1;
  const double macs = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  const bool by_rows = g.m >= g.n;
  const int64_t extent = by_rows ? g.m : g.n, cut = kGemmCut;
  // Pieces differ by up to two cuts: the smallest still has kGemmSplitMacs.
  const double per_cut = static_cast<double>(cut) * static_cast<double>(by_rows ? g.n : g.m) * static_cast<double>(g.k);
  // One piece a thread: more (tried: up to 4 a thread, taken as the threads come free) pack op(B)
  // (rows) or op(A) (columns) once more per piece, and measured no faster on the shared machine.
  const int64_t pieces = std::min({threads, extent / cut, static_cast<int64_t>(macs / (kGemmSplitMacs + 2 * per_cut))});
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const T* ab = a + bi * g.stride_a;
    const T* bb = b + bi * g.stride_b;
    T* cb = c + bi * g.stride_c;
    if (pieces < 2) {
      blas_block(g, ab, bb, cb, 0, g.m, 0, g.n);
      continue;
    }
    parallel_for(pieces, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const auto [lo, hi] = split_range(extent, cut, pieces, p);
        if (lo >= hi) continue;
        if (by_rows) blas_block(g, ab, bb, cb, lo, hi, 0, g.n);
        else blas_block(g, ab, bb, cb, 0, g.m, lo, hi);
      }
    });
  }
}

// One stored matrix (rows x cols, row stride ld) of 16-bit floats as packed f32 (exact).
template <class T>
void widen(const T* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = static_cast<float>(src[i * ld + j]);
}

// bf16 and f16 on the f32 backend: each batch item's A and B widened to packed f32 (exact; once for
// a repeated matrix, stride 0), multiplied by the f32 GEMM (f32 accumulation, blocked and split as
// f32's), C rounded once to the 16-bit type (read widened first when beta != 0). The bits are the
// f32 GEMM's of the same values, then one rounding: the same on every split of the rank's pool.
template <class T>
void half_gemm(const GemmArgs& g, const T* a, const T* b, T* c) {
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  std::vector<float> fa(static_cast<size_t>(a_rows * a_cols)), fb(static_cast<size_t>(b_rows * b_cols));
  std::vector<float> fc(static_cast<size_t>(g.m * g.n));
  GemmArgs f = gemm_args(g.trans_a, g.trans_b, g.m, g.n, g.k, g.beta);
  f.alpha = g.alpha;
  f = resolve_gemm_args(f);
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    if (bi == 0 || g.stride_a != 0) widen(a + bi * g.stride_a, a_rows, a_cols, g.lda, fa.data());
    if (bi == 0 || g.stride_b != 0) widen(b + bi * g.stride_b, b_rows, b_cols, g.ldb, fb.data());
    T* cb = c + bi * g.stride_c;
    if (g.beta != 0) widen(cb, g.m, g.n, g.ldc, fc.data());
    blas_gemm(f, fa.data(), fb.data(), fc.data());
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) cb[i * g.ldc + j] = static_cast<T>(fc[static_cast<size_t>(i * g.n + j)]);
  }
}

template <class T>
void gemm_typed(const GemmArgs& g, const T* a, const T* b, T* c) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  SW_CHECK(c != nullptr, "gemm: C is null for a {}x{} result", g.m, g.n);
  if (g.k == 0) {
    scale_c(g, c);
    return;
  }
  SW_CHECK(a != nullptr && b != nullptr, "gemm: A or B is null for m={} n={} k={}", g.m, g.n, g.k);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    blas_gemm(g, a, b, c);
  } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    half_gemm(g, a, b, c);
  } else {
    naive_gemm(g, a, b, c);
  }
}

}  // namespace

bool gemm_supports(DType dtype) {
  switch (dtype) {
    case DType::F32:
    case DType::F64:
    case DType::F16:
    case DType::BF16:
    case DType::I32:
    case DType::I64:
      return true;
    default:
      return false;
  }
}

GemmArgs resolve_gemm_args(const GemmArgs& args) {
  GemmArgs g = args;
  SW_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0,
           "gemm: m={} n={} k={} batch={} (allowed: all >= 0)", g.m, g.n, g.k, g.batch);
  int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  g.lda = resolve_ld(g.lda, a_cols, "lda");
  g.ldb = resolve_ld(g.ldb, b_cols, "ldb");
  g.ldc = resolve_ld(g.ldc, g.n, "ldc");
  g.stride_a = resolve_stride(g.stride_a, a_rows, g.lda, "stride_a");
  g.stride_b = resolve_stride(g.stride_b, b_rows, g.ldb, "stride_b");
  g.stride_c = resolve_stride(g.stride_c, g.m, g.ldc, "stride_c");
  return g;
}

void gemm(DType dtype, const GemmArgs& args, const void* a, const void* b, void* c) {
  GemmArgs g = resolve_gemm_args(args);
  switch (dtype) {
    case DType::F32:
      return gemm_typed(g, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c));
    case DType::F64:
      return gemm_typed(g, static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(c));
    case DType::F16:
      return gemm_typed(g, static_cast<const f16*>(a), static_cast<const f16*>(b), static_cast<f16*>(c));
    case DType::BF16:
      return gemm_typed(g, static_cast<const bf16*>(a), static_cast<const bf16*>(b), static_cast<bf16*>(c));
    case DType::I32:
      return gemm_typed(g, static_cast<const int32_t*>(a), static_cast<const int32_t*>(b),
                        static_cast<int32_t*>(c));
    case DType::I64:
      return gemm_typed(g, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b),
                        static_cast<int64_t*>(c));
    default:
      fail("gemm does not support {} (allowed: f32, f64, f16, bf16, i32, i64)", dtype_name(dtype));
  }
}

Tensor gemm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  SW_CHECK(a.defined() && b.defined(), "gemm: an operand is undefined");
  SW_CHECK(a.dtype() == b.dtype(), "gemm: operands hold {} and {} (allowed: the same dtype)", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  SW_CHECK((a.ndim() == 2 || a.ndim() == 3) && (b.ndim() == 2 || b.ndim() == 3),
           "gemm: operands of shapes {} and {} (allowed: 2-D or 3-D)", a.shape().to_string(), b.shape().to_string());
  int64_t ba = a.ndim() == 3 ? a.shape()[0] : 1, bb = b.ndim() == 3 ? b.shape()[0] : 1;
  SW_CHECK(ba == bb || ba == 1 || bb == 1, "gemm: batch {} of {} and batch {} of {} differ", ba,
           a.shape().to_string(), bb, b.shape().to_string());
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = trans_a ? as[as.ndim() - 1] : as[as.ndim() - 2];
  g.k = trans_a ? as[as.ndim() - 2] : as[as.ndim() - 1];
  int64_t kb = trans_b ? bs[bs.ndim() - 1] : bs[bs.ndim() - 2];
  g.n = trans_b ? bs[bs.ndim() - 2] : bs[bs.ndim() - 1];
  SW_CHECK(g.k == kb, "gemm: inner dims differ: {} (trans {}) has k = {}, {} (trans {}) has k = {}", as.to_string(),
           trans_a, g.k, bs.to_string(), trans_b, kb);
  g.batch = std::max(ba, bb);
  if (ba == 1 && g.batch != 1) g.stride_a = 0;
  if (bb == 1 && g.batch != 1) g.stride_b = 0;
  Shape out = (a.ndim() == 3 || b.ndim() == 3) ? Shape{g.batch, g.m, g.n} : Shape{g.m, g.n};
  Tensor c = Tensor::uninitialized(a.dtype(), out);  // beta = 0: every element is written
  gemm(a.dtype(), g, a.raw(), b.raw(), c.raw());
  return c;
}


}  // namespace shardwise

