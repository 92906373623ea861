#include "shardwise/tensor/gemm_split_probe.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "shardwise/tensor/gemm_backend.h"

namespace shardwise {

SplitRange split_range(int64_t extent, int64_t cut, int64_t pieces, int64_t p) {
  const int64_t units = (extent + cut - 1) / cut;
  return {std::min(extent, units * p / pieces * cut), std::min(extent, units * (p + 1) / pieces * cut)};
}

namespace {

std::vector<float> probe_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed;
  for (float& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) - 0.5f;
  }
  return v;
}

// C of one [m, n] x k product computed whole and cut into 2, 3 and 4 row (m >= n) or column blocks.
bool same_bits_when_cut(const SgemmFn& sgemm, int m, int n, int k, bool ta, bool tb) {
  const int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
  const std::vector<float> a = probe_values(static_cast<size_t>(m) * k, 1), b = probe_values(static_cast<size_t>(k) * n, 2);
  std::vector<float> whole(static_cast<size_t>(m) * n);
  sgemm(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, whole.data(), ldc);
  const bool by_rows = m >= n;
  for (int64_t pieces : {2, 3, 4}) {
    std::vector<float> cut(whole.size());
    for (int64_t p = 0; p < pieces; ++p) {
      const SplitRange r = split_range(by_rows ? m : n, kGemmCut, pieces, p);
      const int lo = static_cast<int>(r.lo), len = static_cast<int>(r.hi - r.lo);
      if (len <= 0) continue;
      if (by_rows) {
        sgemm(ta, tb, len, n, k, 1.0f, a.data() + (ta ? lo : static_cast<size_t>(lo) * lda), lda, b.data(), ldb, 0.0f,
              cut.data() + static_cast<size_t>(lo) * ldc, ldc);
      } else {
        sgemm(ta, tb, m, len, k, 1.0f, a.data(), lda, b.data() + (tb ? static_cast<size_t>(lo) * ldb : lo), ldb, 0.0f,
              cut.data() + lo, ldc);
      }
    }
    if (std::memcmp(cut.data(), whole.data(), whole.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace

bool sgemm_split_keeps_bits(const SgemmFn& sgemm) {
  // The training step's kinds: activations x weights split by rows, a weight gradient by columns,
  // each with a transposed operand (a few ms on one core).
  return same_bits_when_cut(sgemm, 640, 256, 256, false, true) && same_bits_when_cut(sgemm, 256, 640, 256, true, false);
}

bool gemm_split_keeps_bits() {
  static std::mutex mutex;
  static std::map<std::string, bool> probed;  // by library (its core type included)
  std::lock_guard lock(mutex);
  const std::string name = gemm_backend().library;
  auto it = probed.find(name);
  if (it == probed.end()) it = probed.emplace(name, sgemm_split_keeps_bits(backend_sgemm)).first;
  return it->second;
}

}  // namespace shardwise
