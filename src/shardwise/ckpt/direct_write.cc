#include "shardwise/ckpt/direct_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

std::atomic<uint64_t> g_direct_bytes{0};

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, FreeDeleter>;

// O_DIRECT pwrites of `n` bytes at `offset` (address, offset and length aligned); returns how many
// were written, less than `n` when the file system refuses (EINVAL) or a short write leaves the
// alignment: the caller writes the rest through the page cache.
size_t pwrite_direct(int fd, const fs::path& path, const std::byte* p, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n && done % kDirectAlign == 0) {
    ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL) break;
    if (w < 0) fail_errno("cannot write (O_DIRECT)", path);
    if (w == 0) break;
    done += static_cast<size_t>(w);
  }
  g_direct_bytes.fetch_add(done);
  return done;
}

// The writes in flight: `requests` threads take filled staging buffers in order and write them;
// the producer (the caller) waits for a free buffer before filling the next. The first error stops
// the writes and is rethrown by finish().
class WritePipeline {
 public:
  WritePipeline(int direct_fd, FileHandle& buffered, size_t piece, int requests)
      : fd_(direct_fd), buffered_(buffered), piece_(piece), max_buffers_(static_cast<size_t>(requests) + 1) {
    for (int t = 0; t < requests; ++t) threads_.emplace_back([this] { work(); });
  }
  ~WritePipeline() { stop(); }

  // A staging buffer of `piece` bytes to fill (nullptr once a write failed).
  std::byte* acquire() {
    std::unique_lock lock(mutex_);
    if (free_.empty() && buffers_.size() < max_buffers_) {
      void* p = std::aligned_alloc(kDirectAlign, piece_);
      SW_CHECK(p, "cannot allocate {} bytes of staging buffer for '{}'", piece_, buffered_.path().string());
      buffers_.emplace_back(static_cast<std::byte*>(p));
      return buffers_.back().get();
    }
    cv_.wait(lock, [&] { return !free_.empty() || error_; });
    if (error_) return nullptr;
    std::byte* b = free_.back();
    free_.pop_back();
    return b;
  }
  size_t piece() const { return piece_; }
  // Writes `n` bytes (a multiple of the alignment) of an acquired buffer at `offset`.
  void submit(std::byte* buffer, uint64_t offset, size_t n) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back({buffer, offset, n});
    }
    cv_.notify_all();
  }
  void finish() {
    stop();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Job {
    std::byte* buffer;
    uint64_t offset;
    size_t n;
  };

  void stop() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  void work() {
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return !jobs_.empty() || closing_; });
      if (jobs_.empty()) return;
      Job job = jobs_.front();
      jobs_.pop_front();
      const bool skip = static_cast<bool>(error_);
      lock.unlock();
      try {
        if (!skip) {
          const size_t done = pwrite_direct(fd_, buffered_.path(), job.buffer, job.n, job.offset);
          if (done < job.n) buffered_.pwrite_all({job.buffer + done, job.n - done}, job.offset + done);
        }
      } catch (...) {
        std::lock_guard guard(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      lock.lock();
      free_.push_back(job.buffer);
      cv_.notify_all();
    }
  }

  int fd_;
  FileHandle& buffered_;
  size_t piece_, max_buffers_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<std::byte*> free_;
  std::vector<AlignedBuffer> buffers_;
  std::exception_ptr error_;
  bool closing_ = false;
  std::vector<std::thread> threads_;
};

// The segments' bytes [at, at + n) into `out`; `seg`/`seg_at` walk the segments in order.
void gather(std::span<const WriteSegment> segments, size_t& seg, size_t& seg_at, std::byte* out, size_t n) {
  while (n > 0) {
    const WriteSegment& s = segments[seg];
    const size_t k = std::min(n, s.n - seg_at);
    std::memcpy(out, s.data + seg_at, k);
    out += k;
    n -= k;
    seg_at += k;
    if (seg_at == s.n) ++seg, seg_at = 0;
  }
}

// Allocated (unwritten) extents for [offset, offset + n): ext4 runs aligned direct writes into
// them concurrently, where filling holes takes the inode lock for each write; and a full disk is
// found before writing.
void reserve(const FileHandle& file, uint64_t offset, uint64_t n) {
  if (::fallocate(file.fd(), 0, static_cast<off_t>(offset), static_cast<off_t>(n)) != 0 && errno != EOPNOTSUPP &&
      errno != ENOSYS) {
    int e = errno;
    fail("cannot reserve {} bytes for '{}': {}", n, file.path().string(), std::strerror(e));
  }
}

// Staging buffers (a multiple of the alignment) no larger than `bytes` rounded up to it (a small
// write gets one buffer of its own size), and as many writes in flight as it has pieces, up to
// tuning.direct_requests.
std::pair<size_t, int> staging_for(uint64_t bytes, const SaveTuning& tuning) {
  bytes = std::max<uint64_t>((bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign, kDirectAlign);
  const auto piece = static_cast<size_t>(
      std::min<uint64_t>(std::max(tuning.direct_piece / kDirectAlign * kDirectAlign, kDirectAlign), bytes));
  const int requests = static_cast<int>(std::clamp<uint64_t>((bytes + piece - 1) / piece, 1,
                                                              static_cast<uint64_t>(std::max(tuning.direct_requests, 1))));
  return {piece, requests};
}

// The parts of `segs` (adjacent, in order) inside [from, to), through the page cache.
void pwrite_part(FileHandle& file, std::span<const WriteSegment> segs, uint64_t from, uint64_t to) {
  for (const WriteSegment& s : segs) {
    const uint64_t a = std::max(from, s.offset), b = std::min(to, s.offset + s.n);
    if (a < b) file.pwrite_all({s.data + (a - s.offset), static_cast<size_t>(b - a)}, a);
  }
}

}  // namespace

SaveTuning& save_tuning() {
  static SaveTuning tuning;
  return tuning;
}

uint64_t direct_write_bytes() { return g_direct_bytes.load(); }

FileDigest write_file_streamed(const fs::path& path, std::span<const WriteSegment> segments, bool with_sha256,
                               const SaveTuning& tuning) {
  uint64_t size = 0;
  for (const WriteSegment& s : segments) {
    SW_CHECK(s.offset == size, "writing '{}': a segment at byte {} where byte {} was expected", path.string(), s.offset,
             size);
    size += s.n;
  }
  StreamDigest digest(with_sha256);
  FileHandle buffered(path, O_WRONLY | O_CREAT | O_TRUNC);
  std::optional<FileHandle> direct;
  if (tuning.direct && size > 0) direct = FileHandle::open_direct(path, O_WRONLY);
  if (!direct) {  // not asked, or refused (EINVAL on file systems without direct I/O): the page cache
    for (const WriteSegment& s : segments) {
      digest.update({s.data, s.n});
      buffered.pwrite_all({s.data, s.n}, s.offset);
    }
    buffered.close();
    return digest.finish();
  }
  const uint64_t padded = (size + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  reserve(*direct, 0, padded);
  const auto [piece, requests] = staging_for(padded, tuning);
  WritePipeline pipeline(direct->fd(), buffered, piece, requests);
  size_t seg = 0, seg_at = 0;
  for (uint64_t at = 0; at < size;) {
    std::byte* b = pipeline.acquire();
    if (!b) break;  // a write failed: finish() raises it
    const auto n = static_cast<size_t>(std::min<uint64_t>(piece, size - at));
    gather(segments, seg, seg_at, b, n);
    digest.update({b, n});
    const size_t whole = (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(b + n, 0, whole - n);  // the file's last block, cut back by the truncate below
    pipeline.submit(b, at, whole);
    at += n;
  }
  pipeline.finish();
  buffered.truncate(size);
  direct->close();
  buffered.close();
  return digest.finish();
}

std::vector<PartDigest> write_runs(FileHandle& file, std::span<const WriteSegment> runs, const SaveTuning& tuning) {
  uint64_t total = 0, end = 0;
  for (const WriteSegment& r : runs) {
    SW_CHECK(r.offset >= end, "writing '{}': a run at byte {} overlaps or precedes the one ending at {}",
             file.path().string(), r.offset, end);
    end = r.offset + r.n;
    total += r.n;
  }
  std::optional<FileHandle> direct;
  if (tuning.direct && total >= kDirectAlign) direct = FileHandle::open_direct(file.path(), O_WRONLY);
  std::vector<PartDigest> parts;
  std::optional<WritePipeline> pipeline;  // made at the first stretch that covers a block whole
  for (size_t i = 0; i < runs.size();) {
    size_t j = i + 1;
    uint64_t stop = runs[i].offset + runs[i].n;
    while (j < runs.size() && runs[j].offset == stop) stop += runs[j++].n;
    const std::span<const WriteSegment> stretch = runs.subspan(i, j - i);
    const uint64_t start = runs[i].offset;
    const uint64_t a = (start + kDirectAlign - 1) / kDirectAlign * kDirectAlign, b = stop / kDirectAlign * kDirectAlign;
    i = j;
    StreamDigest digest(false);
    for (const WriteSegment& r : stretch) digest.update({r.data, r.n});
    parts.push_back({start, stop - start, digest.finish().xxh64});
    if (!direct || a >= b) {  // no O_DIRECT, or no whole block: it may share each with another writer
      pwrite_part(file, stretch, start, stop);
      continue;
    }
    pwrite_part(file, stretch, start, a);
    pwrite_part(file, stretch, b, stop);
    reserve(*direct, a, b - a);
    if (!pipeline) {
      const auto [piece, requests] = staging_for(total, tuning);
      pipeline.emplace(direct->fd(), file, piece, requests);
    }
    size_t seg = 0, seg_at = 0;
    for (uint64_t skip = a - start; skip > 0;) {  // to byte a of the stretch
      const uint64_t k = std::min<uint64_t>(skip, stretch[seg].n - seg_at);
      seg_at += static_cast<size_t>(k);
      skip -= k;
      if (seg_at == stretch[seg].n) ++seg, seg_at = 0;
    }
    const size_t piece = pipeline->piece();
    for (uint64_t at = a; at < b;) {
      std::byte* buf = pipeline->acquire();
      if (!buf) break;  // a write failed: finish() raises it
      const auto n = static_cast<size_t>(std::min<uint64_t>(piece, b - at));
      gather(stretch, seg, seg_at, buf, n);
      pipeline->submit(buf, at, n);
      at += n;
    }
  }
  if (pipeline) pipeline->finish();
  if (direct) direct->close();
  return parts;
}

}  // namespace shardwise::ckpt
