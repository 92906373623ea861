#include "shardwise/ckpt/parallel_read.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "shardwise/core/error.h"
#include "shardwise/tensor/allocator.h"

namespace shardwise::ckpt {

namespace {

std::atomic<uint64_t> g_direct_bytes{0};
std::atomic<uint64_t> g_piece_bytes{0};

// Runs `job(i)` for i in [0, n) on `threads` threads (the caller one of them), each taking the next
// index; the first error is rethrown on the caller after all threads finished.
template <class Job>
void run_jobs(size_t n, int threads, const Job& job) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < n;) job(i);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), n);
  for (size_t t = 1; t < k; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// O_DIRECT preads of `n` bytes at `offset` (both aligned); returns how many were read, less than
// `n` when the file system refuses (EINVAL), the file ends or a short read leaves the alignment:
// the caller reads the rest through the page cache (which reports a short file).
size_t pread_direct(int fd, const fs::path& path, std::byte* p, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n && (offset + done) % kDirectAlign == 0) {
    ssize_t got = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EINVAL) break;
    if (got < 0) {
      int e = errno;
      fail("cannot read '{}' (O_DIRECT): {}", path.string(), std::strerror(e));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  g_direct_bytes.fetch_add(done);
  return done;
}

// preadv until every buffer of `iov` is full (the kernel reads IOV_MAX buffers a call, and may
// return early); `iov` is consumed.
void preadv_all(const FileHandle& file, std::vector<iovec>& iov, uint64_t offset) {
  for (size_t i = 0; i < iov.size();) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX));
    ssize_t n = ::preadv(file.fd(), iov.data() + i, count, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("cannot read", file.path());
    if (n == 0) fail("cannot read '{}': file ends before byte {}", file.path().string(), offset + iov[i].iov_len);
    offset += static_cast<uint64_t>(n);
    for (auto left = static_cast<size_t>(n); left > 0;) {
      const size_t take = std::min(left, iov[i].iov_len);
      iov[i].iov_base = static_cast<std::byte*>(iov[i].iov_base) + take;
      iov[i].iov_len -= take;
      left -= take;
      if (iov[i].iov_len == 0) ++i;
    }
    while (i < iov.size() && iov[i].iov_len == 0) ++i;
  }
}

}  // namespace

uint64_t direct_read_bytes() { return g_direct_bytes.load(); }
uint64_t span_piece_read_bytes() { return g_piece_bytes.load(); }

void pread_ranges_direct(const FileHandle& buffered, std::span<const ReadRange> ranges, int requests, size_t piece) {
  piece = std::max(piece / kDirectAlign * kDirectAlign, kDirectAlign);
  const std::optional<FileHandle> direct = FileHandle::open_direct(buffered.path(), O_RDONLY);
  if (!direct) {  // refused (EINVAL on file systems without direct I/O): all through the page cache
    pread_ranges(buffered, ranges, 1);
    return;
  }
  struct Job {
    ReadRange r;
    bool direct;
  };
  std::vector<Job> jobs;
  for (const ReadRange& r : ranges) {
    if (r.n == 0) continue;
    const uint64_t lo = (r.offset + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    const uint64_t hi = (r.offset + r.n) / kDirectAlign * kDirectAlign;
    const bool same_residue = (reinterpret_cast<uintptr_t>(r.dst) - r.offset) % kDirectAlign == 0;
    if (!same_residue || hi <= lo) {
      jobs.push_back({r, false});
      continue;
    }
    if (lo > r.offset) jobs.push_back({{r.offset, r.dst, static_cast<size_t>(lo - r.offset)}, false});
    for (uint64_t at = lo; at < hi; at += piece) {
      jobs.push_back({{at, r.dst + (at - r.offset), static_cast<size_t>(std::min<uint64_t>(piece, hi - at))}, true});
    }
    if (r.offset + r.n > hi) jobs.push_back({{hi, r.dst + (hi - r.offset), static_cast<size_t>(r.offset + r.n - hi)}, false});
  }
  run_jobs(jobs.size(), requests, [&](size_t i) {
    const ReadRange& r = jobs[i].r;
    const size_t done = jobs[i].direct ? pread_direct(direct->fd(), buffered.path(), r.dst, r.n, r.offset) : 0;
    if (done < r.n) buffered.pread_all({r.dst + done, r.n - done}, r.offset + done);
  });
}

void pread_span_pieces(const FileHandle& file, std::span<const ReadRange> ranges, int threads, size_t piece) {
  piece = std::max<size_t>(piece, 1);
  SW_CHECK(std::is_sorted(ranges.begin(), ranges.end(), [](const ReadRange& a, const ReadRange& b) { return a.offset < b.offset; }),
           "pread_span_pieces: the ranges of '{}' are not in file order", file.path().string());
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const ReadRange& r : ranges) {
    if (r.n == 0) continue;
    lo = std::min(lo, r.offset);
    hi = std::max(hi, r.offset + r.n);
  }
  if (hi <= lo) return;
  const uint64_t pieces = (hi - lo + piece - 1) / piece;
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), pieces);
  // One scratch buffer for every gap between ranges (its bytes are never read: the kernel may
  // write several gaps into it at once), from the storage cache, which keeps it for the next tensor.
  uint64_t gap = 0, at = lo;
  for (const ReadRange& r : ranges) {
    if (r.n == 0) continue;
    gap = std::max(gap, r.offset - at);
    at = r.offset + r.n;
  }
  const size_t junk_size = static_cast<size_t>(std::clamp<uint64_t>(gap, 1, piece));
  const std::shared_ptr<std::byte[]> junk = allocate_storage(junk_size, false);
  // Each thread takes the next piece until none is left: its ranges' parts (from the first range
  // ending past it) and the gaps between them as one scatter list, read by preadv.
  std::atomic<uint64_t> next{0};
  run_jobs(k, static_cast<int>(k), [&](size_t) {
    std::vector<iovec> iov;
    for (uint64_t p; (p = next.fetch_add(1)) < pieces;) {
      const uint64_t a = lo + p * piece, b = std::min(hi, a + piece);
      iov.clear();
      uint64_t start = 0, cursor = 0;
      auto it = std::partition_point(ranges.begin(), ranges.end(), [&](const ReadRange& r) { return r.offset + r.n <= a; });
      for (; it != ranges.end() && it->offset < b; ++it) {
        const uint64_t from = std::max(it->offset, a), to = std::min(it->offset + it->n, b);
        if (from >= to) continue;
        if (iov.empty()) start = cursor = from;
        for (; cursor < from; cursor += std::min<uint64_t>(junk_size, from - cursor))
          iov.push_back({junk.get(), static_cast<size_t>(std::min<uint64_t>(junk_size, from - cursor))});
        iov.push_back({it->dst + (from - it->offset), static_cast<size_t>(to - from)});
        cursor = to;
      }
      preadv_all(file, iov, start);
      g_piece_bytes.fetch_add(cursor - start);
    }
  });
}

LoadTuning& load_tuning() {
  static LoadTuning tuning;
  return tuning;
}

void pread_ranges(const FileHandle& file, std::span<const ReadRange> ranges, int threads, size_t piece) {
  piece = std::max<size_t>(piece, 1);
  uint64_t total = 0;
  for (const ReadRange& r : ranges) total += r.n;
  if (threads <= 1 || total <= piece) {
    for (const ReadRange& r : ranges) {
      if (r.n) file.pread_all({r.dst, r.n}, r.offset);
    }
    return;
  }
  // Pieces in file order; piece i starting at byte `at` of the plan goes to share at * k / total.
  const auto k = static_cast<uint64_t>(std::min<uint64_t>(static_cast<uint64_t>(threads), (total + piece - 1) / piece));
  std::vector<std::vector<ReadRange>> shares(k);
  uint64_t at = 0;
  for (const ReadRange& r : ranges) {
    for (size_t done = 0; done < r.n;) {
      size_t n = std::min(piece, r.n - done);
      shares[std::min(k - 1, at * k / total)].push_back({r.offset + done, r.dst + done, n});
      done += n;
      at += n;
    }
  }
  run_jobs(k, static_cast<int>(k), [&](size_t t) {  // thread t reads share t, in file order
    for (const ReadRange& r : shares[t]) file.pread_all({r.dst, r.n}, r.offset);
  });
}

}  // namespace shardwise::ckpt
