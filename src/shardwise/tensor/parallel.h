#pragma once
// The threads a rank's kernels split their loops over: one ThreadPool per rank, installed on the
// rank's thread by a ParallelScope (ranks may be threads of one process, so the pool belongs to
// the thread that runs the rank, never to the process). A kernel calls parallel_for; without a
// pool on the calling thread (or on a pool's own workers: no nesting) the loop runs inline.
//
// Determinism: parallel_for hands out disjoint ranges of independent work (elementwise loops,
// rows of a row-wise op, columns of a column sum), so its results never depend on the thread
// count or on how the range was cut. A reduction that combines values across a range uses
// parallel_blocks: fixed-size blocks (the split points depend on the data size only), one
// partial per block, combined by the caller in block order.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace shardwise {

// Elements (or element-equivalents of work) below which a loop stays on one thread: waking a
// worker costs a few microseconds, about what 32 Ki simple float operations take.
inline constexpr int64_t kParallelGrain = 32768;

class ThreadPool {
 public:
  // `threads` >= 1 in all, the calling thread included (threads - 1 workers are started).
  // `grain` > 0 replaces every loop's own grain (tests: 1 splits even the smallest loop, so that
  // every kernel's split points are exercised on a small model).
  explicit ThreadPool(int threads, int64_t grain = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  int64_t grain() const { return grain_; }

  // Calls fn(ctx, t) for every t in [0, tasks) on the caller and the workers, and returns when all
  // are done. The first exception a task throws is rethrown here (the other tasks still run).
  // Not reentrant: one run at a time (a rank's kernels run one after another).
  void run(int64_t tasks, void (*fn)(void*, int64_t), void* ctx);

 private:
  void work();
  void drain(std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  int64_t grain_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  // Written under mutex_; atomic so that a worker waiting for the next run and the caller waiting
  // for the last task can spin on them briefly (parallel.cc's kSpin) before sleeping on the condition.
  std::atomic<uint64_t> generation_{0};  // a new run bumps it
  std::atomic<bool> stop_{false};
  void (*fn_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  int64_t tasks_ = 0, next_ = 0;
  std::atomic<int64_t> finished_{0};
  std::exception_ptr error_;
};

// Makes `pool` (null: none) the calling thread's pool until the scope ends (the previous one is
// restored). A rank creates its pool and a scope on the thread that runs it.
class ParallelScope {
 public:
  explicit ParallelScope(ThreadPool* pool);
  ~ParallelScope();
  ParallelScope(const ParallelScope&) = delete;
  ParallelScope& operator=(const ParallelScope&) = delete;

 private:
  ThreadPool* saved_;
};

// A rank's own pool, installed on the calling thread (the rank's) while the object lives. A pool of
// more than one thread also runs the rank's GEMMs (tensor/gemm.h): each is cut into one piece per
// thread, every piece on one library thread, so the rank's cores are the same threads inside and
// outside GEMMs (no second set of GEMM library threads spinning beside the pool's).
class RankThreads {
 public:
  explicit RankThreads(int threads, int64_t grain = 0);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

 private:
  ThreadPool pool_;
  ParallelScope scope_;
};

// The calling thread's pool (null: none) and its thread count (1 without a pool).
ThreadPool* current_thread_pool();
int parallel_threads();

// fn(begin, end) over disjoint ranges covering [0, n), each at least `grain` long (n <= grain, or no
// pool: fn(0, n) on the caller), at most kPiecesPerThread per thread: the threads take pieces as
// they come free, so a worker the system has not scheduled yet holds up the loop by one piece at
// most (the machine may be shared). For independent work only.
inline constexpr int64_t kPiecesPerThread = 4;

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  ThreadPool* pool = current_thread_pool();
  if (n <= 0) return;
  int64_t g = pool != nullptr && pool->grain() > 0 ? pool->grain() : grain;
  if (g < 1) g = 1;
  if (pool == nullptr || pool->threads() == 1 || n <= g) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunks = (n + g - 1) / g;
  if (chunks > pool->threads() * kPiecesPerThread) chunks = pool->threads() * kPiecesPerThread;
  struct Ctx {
    F* fn;
    int64_t n, chunks;
  } ctx{&fn, n, chunks};
  pool->run(chunks, [](void* p, int64_t t) {
    auto* c = static_cast<Ctx*>(p);
    (*c->fn)(c->n * t / c->chunks, c->n * (t + 1) / c->chunks);
  }, &ctx);
}

// parallel_for with every cut between two pieces at a multiple of `cut` (the last piece ends at n):
// threads writing neighbouring ranges of an array then never share a cache line.
template <class F>
void parallel_for_cuts(int64_t n, int64_t grain, int64_t cut, F&& fn) {
  if (n <= 0) return;
  const int64_t c = cut < 1 ? 1 : cut;
  const int64_t units = (n + c - 1) / c;
  parallel_for(units, (grain + c - 1) / c, [&](int64_t u0, int64_t u1) { fn(u0 * c, u1 * c < n ? u1 * c : n); });
}

// Column sums with the columns split over the threads (a bias gradient, a norm's dscale): fn(c0, c1)
// over ranges of columns cut at multiples of 16 (at most kPiecesPerThread a thread, taken as the
// threads come free). A kernel walks the rows in order, adding each row's run of its columns into a
// local array, and stores the array once: each sum is the single loop's (the same bits on any thread
// count), and no thread writes a cache line another one writes row after row. (One range a thread,
// tried, read longer runs but made a preempted thread hold up the whole sum: slower on the shared
// machine.)
template <class F>
void parallel_columns(int64_t cols, int64_t grain, F&& fn) {
  parallel_for_cuts(cols, grain, 16, fn);
}

// fn(block, begin, end) for the blocks [block * block_size, min(n, (block + 1) * block_size)) of
// [0, n), spread over the threads. The blocks depend on n and block_size only: a reduction keeps
// one partial per block and combines them in block order to get the same bits on any thread count.
template <class F>
void parallel_blocks(int64_t n, int64_t block_size, F&& fn) {
  if (n <= 0) return;
  const int64_t bs = block_size < 1 ? 1 : block_size;
  const int64_t blocks = (n + bs - 1) / bs;
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b, b * bs, b + 1 == blocks ? n : (b + 1) * bs);
  });
}

}  // namespace shardwise
