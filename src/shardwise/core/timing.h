#pragma once
// The time of a piece of work as measurements here take it: one warm-up run (first-call set-up,
// caches), then the fastest (or the median) of `reps` runs, in seconds.
#include <algorithm>
#include <chrono>
#include <vector>

namespace shardwise {

template <class Fn>
double fastest_seconds(int reps, Fn&& fn) {
  fn();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The median of a non-empty list (the mean of the two middle ones for an even count).
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The median of `reps` runs after a warm-up: what the work takes as the machine is now (a shared
// machine's other work included), where fastest_seconds says what it takes when nothing interferes.
template <class Fn>
double median_seconds(int reps, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(std::move(t));
}

}  // namespace shardwise
