#include "shardwise/tensor/gemm_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "shardwise/core/error.h"
#include "shardwise/core/timing.h"

namespace shardwise {

std::vector<GemmCase> step_gemm_cases(const StepShape& s) {
  const int64_t N = s.tokens, H = s.hidden, V = s.vocab, S = s.seq, L = s.layers;
  const int64_t hd = H / s.heads, bh = std::max<int64_t>(1, N / S) * s.heads;  // >= 1 sequence
  const double l = static_cast<double>(L);
  std::vector<GemmCase> cases;
  // A linear layer y[N, out] = x[N, in] W[in, out]: forward NN, dx = dy W^T (NT), dW = x^T dy (TN).
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    cases.push_back({name + " fwd", false, false, N, out, in, 1, 0, 0, l});
    cases.push_back({name + " dx", false, true, N, in, out, 1, 0, 0, l});
    cases.push_back({name + " dW", true, false, in, out, N, 1, 0, 0, l});
  };
  linear("attn.qkv", H, 3 * H);
  linear("attn.proj", H, H);
  linear("mlp.fc", H, 4 * H);
  linear("mlp.proj", 4 * H, H);
  // The tied LM head: logits = x wte^T (NT), dx = dlogits wte (NN), dwte = dlogits^T x (TN).
  cases.push_back({"lm_head fwd", false, true, N, V, H, 1, 0, 0, 1});
  cases.push_back({"lm_head dx", false, false, N, H, V, 1, 0, 0, 1});
  cases.push_back({"lm_head dW", true, false, V, H, N, 1, 0, 0, 1});
  // Attention over batch x heads: scores = q k^T, ctx = p v, and their backward products.
  cases.push_back({"attn scores", false, true, S, S, hd, bh, 0, 0, l});
  cases.push_back({"attn ctx", false, false, S, hd, S, bh, 0, 0, l});
  cases.push_back({"attn dprobs", false, true, S, S, hd, bh, 0, 0, l});
  cases.push_back({"attn dv", true, false, S, hd, S, bh, 0, 0, l});
  cases.push_back({"attn dq", false, false, S, hd, S, bh, 0, 0, l});
  cases.push_back({"attn dk", true, false, S, hd, S, bh, 0, 0, l});
  return cases;
}

std::vector<GemmCase> odd_gemm_cases(int64_t max_size) {
  std::vector<int64_t> sizes;
  for (int64_t v : {1, 3, 17, 127, 1025})
    if (v <= max_size) sizes.push_back(v);
  std::vector<GemmCase> cases;
  int i = 0;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) {
        if (m * n * k > 1025 * 127 * 17) continue;  // keeps the check to about a second
        for (auto [ta, tb] : {std::pair{false, false}, {false, true}, {true, false}}) {
          ++i;
          GemmCase c{fmt::format("odd {}x{}x{}{}{}", m, n, k, ta ? " TN" : tb ? " NT" : " NN", ""), ta, tb, m, n, k};
          c.pad = i % 3 == 0 ? 5 : 0;
          c.beta = i % 4 == 1 ? 1.0f : 0.0f;
          c.batch = i % 5 == 2 ? 3 : 1;
          if (c.pad) c.what += " padded";
          if (c.beta != 0) c.what += " beta=1";
          if (c.batch > 1) c.what += " batch 3";
          cases.push_back(c);
        }
      }
  return cases;
}

namespace {

struct Operands {
  int64_t a_rows, a_cols, b_rows, b_cols, lda, ldb, ldc;
  std::vector<float> a, b, c;  // batch items back to back
};

Operands make_operands(const GemmCase& g, std::mt19937_64& rng) {
  Operands o;
  o.a_rows = g.ta ? g.k : g.m;
  o.a_cols = g.ta ? g.m : g.k;
  o.b_rows = g.tb ? g.n : g.k;
  o.b_cols = g.tb ? g.k : g.n;
  o.lda = o.a_cols + g.pad;
  o.ldb = o.b_cols + g.pad;
  o.ldc = g.n + g.pad;
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, size_t size) {
    v.resize(size);
    for (auto& x : v) x = d(rng);
  };
  fill(o.a, static_cast<size_t>(g.batch * o.a_rows * o.lda));
  fill(o.b, static_cast<size_t>(g.batch * o.b_rows * o.ldb));
  fill(o.c, static_cast<size_t>(g.batch * g.m * o.ldc));
  return o;
}

void run(const GemmCase& g, const Operands& o, std::vector<float>& c, const SgemmFn& fn) {
  for (int64_t bi = 0; bi < g.batch; ++bi)
    fn(g.ta, g.tb, static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1.0f,
       o.a.data() + bi * o.a_rows * o.lda, static_cast<int>(o.lda), o.b.data() + bi * o.b_rows * o.ldb,
       static_cast<int>(o.ldb), g.beta, c.data() + bi * g.m * o.ldc, static_cast<int>(o.ldc));
}

// Rows (or columns) to check: the first two, the middle, the last two, and a few random ones.
std::vector<int64_t> sample(int64_t size, std::mt19937_64& rng, int random) {
  std::set<int64_t> s{0, 1, size / 2, size - 2, size - 1};
  std::uniform_int_distribution<int64_t> d(0, size - 1);
  for (int i = 0; i < random; ++i) s.insert(d(rng));
  std::vector<int64_t> out;
  for (int64_t v : s)
    if (v >= 0 && v < size) out.push_back(v);
  return out;
}

}  // namespace

GemmCheckResult check_sgemm(const std::vector<GemmCase>& cases, const SgemmFn& fn, uint64_t seed) {
  GemmCheckResult r;
  std::mt19937_64 rng(seed);
  const double u = std::ldexp(1.0, -24);
  for (const auto& g : cases) {
    Operands o = make_operands(g, rng);
    std::vector<float> c = o.c;
    run(g, o, c, fn);
    ++r.cases;
    const double kk = static_cast<double>(g.k + 2) * u;
    const double gamma = kk / (1 - kk);
    // Records error / tolerance; after the first failure, the result keeps naming that one.
    auto fail = [&](double ratio) {
      const bool bad = !(ratio <= 1);
      if (r.ok && (bad || ratio > r.worst)) {
        r.worst = std::isnan(ratio) ? HUGE_VAL : ratio;
        r.worst_case = g.what;
      }
      if (bad) r.ok = false;
    };
    for (int64_t bi = 0; bi < g.batch; ++bi) {
      const float* a = o.a.data() + bi * o.a_rows * o.lda;
      const float* b = o.b.data() + bi * o.b_rows * o.ldb;
      const float* c0 = o.c.data() + bi * g.m * o.ldc;
      const float* c1 = c.data() + bi * g.m * o.ldc;
      for (int64_t i = 0; i < g.m; ++i)  // the padding of C is never written
        for (int64_t j = g.n; j < o.ldc; ++j)
          if (std::memcmp(&c0[i * o.ldc + j], &c1[i * o.ldc + j], sizeof(float)) != 0) fail(HUGE_VAL);
      for (int64_t i : sample(g.m, rng, 6))
        for (int64_t j : sample(g.n, rng, 10)) {
          double exact = 0, bound = 0;
          for (int64_t p = 0; p < g.k; ++p) {
            double av = g.ta ? a[p * o.lda + i] : a[i * o.lda + p];
            double bv = g.tb ? b[j * o.ldb + p] : b[p * o.ldb + j];
            exact += av * bv;
            bound += std::fabs(av * bv);
          }
          double cin = c0[i * o.ldc + j];
          exact += g.beta * cin;
          bound += std::fabs(g.beta * cin);
          double got = c1[i * o.ldc + j];
          double err = std::isfinite(got) ? std::fabs(got - exact) : HUGE_VAL;
          fail(err / (gamma * bound + std::numeric_limits<float>::denorm_min()));
          ++r.elements;
        }
    }
  }
  return r;
}

double time_sgemm(const GemmCase& g, const SgemmFn& fn, int reps) {
  std::mt19937_64 rng(7);
  Operands o = make_operands(g, rng);
  std::vector<float> c = o.c;
  return fastest_seconds(reps, [&] { run(g, o, c, fn); });  // the warm-up takes the library's first-call set-up
}

}  // namespace shardwise
