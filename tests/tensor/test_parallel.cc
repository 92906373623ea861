// The rank's kernel pool (tensor/parallel.h): parallel_for covers its range once in disjoint
// pieces, runs inline without a pool and on the pool's own workers, rethrows a task's exception;
// parallel_blocks cuts by the data size alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "shardwise/tensor/parallel.h"

namespace shardwise {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

Ranges ranges_of(int64_t n, int64_t grain) {
  Ranges r;
  std::mutex m;
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    std::lock_guard lock(m);
    r.emplace_back(b, e);
  });
  std::sort(r.begin(), r.end());
  return r;
}

TEST(ParallelFor, CoversTheRangeOnceInDisjointPieces) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    ParallelScope scope(&pool);
    EXPECT_EQ(parallel_threads(), threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1000}, int64_t{100003}}) {
      Ranges r = ranges_of(n, 100);
      int64_t at = 0;
      for (auto [b, e] : r) {
        EXPECT_EQ(b, at) << "threads " << threads << " n " << n;
        EXPECT_LT(b, e);
        at = e;
      }
      EXPECT_EQ(at, n);
      // At most kPiecesPerThread pieces per thread, each at least the grain (unless the range is
      // shorter); one thread runs the range whole.
      const int64_t pieces = threads == 1 ? 1 : threads * kPiecesPerThread;
      const int64_t want = n == 0 ? 0 : std::min<int64_t>(pieces, std::max<int64_t>(1, (n + 99) / 100));
      EXPECT_EQ(static_cast<int64_t>(r.size()), want) << "threads " << threads << " n " << n;
    }
  }
}

TEST(ParallelFor, UsesTheWorkers) {
  ThreadPool pool(3);
  ParallelScope scope(&pool);
  std::mutex m;
  std::vector<std::thread::id> ids;
  // Each piece waits until all three have started: only three threads running at once get through.
  std::atomic<int> started{0};
  parallel_for(3, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard lock(m);
      ids.push_back(std::this_thread::get_id());
    }
    ++started;
    while (started.load() < 3) std::this_thread::yield();
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()) - ids.begin(), 3);
}

TEST(ParallelFor, InlineWithoutAPoolAndOnWorkers) {
  EXPECT_EQ(current_thread_pool(), nullptr);
  EXPECT_EQ(ranges_of(1000, 1), (Ranges{{0, 1000}}));
  ThreadPool pool(2);
  {
    ParallelScope scope(&pool);
    std::mutex m;
    std::vector<Ranges> inner;
    parallel_for(2, 1, [&](int64_t, int64_t) {
      Ranges r = ranges_of(1000, 1);  // a nested loop runs whole on the thread that reaches it
      std::lock_guard lock(m);
      inner.push_back(r);
    });
    ASSERT_EQ(inner.size(), 2u);
    // A loop inside a piece runs whole, on the caller's piece as on the worker's (no reentry).
    for (const Ranges& r : inner) EXPECT_EQ(r, (Ranges{{0, 1000}}));
    {
      ParallelScope none(nullptr);
      EXPECT_EQ(parallel_threads(), 1);
    }
    EXPECT_EQ(current_thread_pool(), &pool);  // restored
  }
  EXPECT_EQ(current_thread_pool(), nullptr);
}

TEST(ParallelFor, RethrowsATasksException) {
  ThreadPool pool(3);
  ParallelScope scope(&pool);
  EXPECT_THROW(parallel_for(300, 1, [&](int64_t b, int64_t) {
                 if (b > 0) throw std::runtime_error("bad piece");
               }),
               std::runtime_error);
  // The pool still works afterwards.
  EXPECT_EQ(ranges_of(300, 1).size(), 12u);
}

TEST(ParallelFor, GrainOverrideSplitsSmallLoops) {
  ThreadPool pool(3, 1);
  ParallelScope scope(&pool);
  EXPECT_EQ(ranges_of(7, 1 << 20), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}}));
}

TEST(ParallelBlocks, BlocksDependOnTheSizeOnly) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads, threads == 4 ? 1 : 0);
    ParallelScope scope(&pool);
    std::mutex m;
    std::vector<std::array<int64_t, 3>> blocks;
    parallel_blocks(2500, 1000, [&](int64_t k, int64_t b, int64_t e) {
      std::lock_guard lock(m);
      blocks.push_back({k, b, e});
    });
    std::sort(blocks.begin(), blocks.end());
    EXPECT_EQ(blocks, (std::vector<std::array<int64_t, 3>>{{0, 0, 1000}, {1, 1000, 2000}, {2, 2000, 2500}}))
        << "threads " << threads;
  }
}

}  // namespace
}  // namespace shardwise
