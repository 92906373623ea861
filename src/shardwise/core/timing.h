#pragma once
// The time of a piece of work as measurements here take it: one warm-up run (first-call set-up,
// caches), then the fastest of `reps` runs, in seconds.
#include <algorithm>
#include <chrono>

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

}  // namespace shardwise
