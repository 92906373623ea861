#include "shardwise/tensor/parallel.h"

#include <chrono>
#include <utility>

#include "shardwise/core/error.h"
#include "shardwise/tensor/gemm.h"

namespace shardwise {

namespace {
thread_local ThreadPool* t_pool = nullptr;

// How long a worker keeps polling for the next run, and the caller for a worker's last task, before
// sleeping on the condition variable: a step's kernels follow each other within microseconds, and a
// futex wake-up of a sleeping thread costs about as long as a small kernel piece.
constexpr auto kSpin = std::chrono::microseconds(50);

// Polls done() until it holds or kSpin has passed; true if it holds.
template <class Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}
}  // namespace

ParallelScope::ParallelScope(ThreadPool* pool) : saved_(t_pool) { t_pool = pool; }
ParallelScope::~ParallelScope() { t_pool = saved_; }

ThreadPool::ThreadPool(int threads, int64_t grain) : grain_(grain) {
  SW_CHECK(threads >= 1, "a thread pool needs at least 1 thread, got {}", threads);
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

// Takes tasks of the current run until none is left; `lock` holds mutex_ on entry and on return.
void ThreadPool::drain(std::unique_lock<std::mutex>& lock) {
  while (next_ < tasks_) {
    const int64_t t = next_++;
    lock.unlock();
    std::exception_ptr err;
    try {
      fn_(ctx_, t);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (finished_.fetch_add(1, std::memory_order_release) + 1 == tasks_) done_.notify_all();
  }
}

void ThreadPool::work() {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    lock.unlock();
    spin_until([&] {
      return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
    });
    lock.lock();
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    drain(lock);
  }
}

void ThreadPool::run(int64_t tasks, void (*fn)(void*, int64_t), void* ctx) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    ParallelScope inline_only(nullptr);
    for (int64_t t = 0; t < tasks; ++t) fn(ctx, t);
    return;
  }
  std::unique_lock lock(mutex_);
  fn_ = fn, ctx_ = ctx, tasks_ = tasks, next_ = 0, finished_ = 0, error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  {
    ParallelScope inline_only(nullptr);  // a loop inside a task runs whole on its thread (no reentry)
    drain(lock);
  }
  if (finished_ != tasks_) {
    const int64_t tasks = tasks_;
    lock.unlock();
    spin_until([&] { return finished_.load(std::memory_order_acquire) == tasks; });
    lock.lock();
  }
  done_.wait(lock, [&] { return finished_ == tasks_; });
  tasks_ = 0, next_ = 0;
  if (std::exception_ptr err = std::exchange(error_, nullptr)) std::rethrow_exception(err);
}


RankThreads::RankThreads(int threads, int64_t grain) : pool_(threads, grain), scope_(&pool_) {
  if (pool_.threads() > 1) gemm_split_begin();
}

RankThreads::~RankThreads() {
  if (pool_.threads() > 1) gemm_split_end();
}

ThreadPool* current_thread_pool() { return t_pool; }
int parallel_threads() { return t_pool ? t_pool->threads() : 1; }

}  // namespace shardwise
