#include "shardwise/generate/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/core/philox.h"

namespace shardwise::train {

void SamplingConfig::validate() const {
  SW_CHECK(std::isfinite(temperature) && temperature >= 0, "--temperature must be 0 (greedy) or positive, got {}",
           temperature);
  SW_CHECK(top_k >= 0, "--top-k must be 0 (every token) or positive, got {}", top_k);
  SW_CHECK(top_p > 0 && top_p <= 1, "--top-p must be in (0, 1], got {}", top_p);
}

int64_t choose_token(std::span<const float> logits, const SamplingConfig& c, int64_t sequence, int64_t position) {
  SW_CHECK(!logits.empty(), "choose_token: no logits");
  const auto n = static_cast<int64_t>(logits.size());
  if (c.greedy()) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  // Candidates by decreasing logit (the lower index first on a tie): a total order, so the
  // kept set and the walk below do not depend on the sort's implementation.
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int64_t a, int64_t b) {
    float x = logits[static_cast<size_t>(a)], y = logits[static_cast<size_t>(b)];
    return x != y ? x > y : a < b;
  };
  const int64_t k = c.top_k > 0 ? std::min(c.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(static_cast<size_t>(k));
  // Softmax of logits / temperature over the kept tokens, in f64.
  const double top = logits[static_cast<size_t>(order[0])];
  std::vector<double> p(order.size());
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    p[i] = std::exp((logits[static_cast<size_t>(order[i])] - top) / c.temperature);
    total += p[i];
  }
  // Nucleus: the shortest prefix whose probability reaches top_p (at least one token).
  size_t kept = order.size();
  if (c.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += p[i] / total;
      if (mass >= c.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  double kept_total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(kept), 0.0);
  Philox rng(c.seed, stream_id(fmt::format("generate/{}", sequence)));
  double u = rng.uniform_f64(static_cast<uint64_t>(position)) * kept_total;
  for (size_t i = 0; i < kept; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[kept - 1];  // rounding left u just above the last weight
}

}  // namespace shardwise::train
